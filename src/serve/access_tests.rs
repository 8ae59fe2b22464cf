//! The admin endpoints' confinement to the model roots, one test per way out, and
//! the key comparison.

use std::path::{Path, PathBuf};

use super::{keys_match, AccessError, AdminAccess};
use crate::serve::config::{AdminConfig, ModelConfig};

/// A root with a model folder in it, and a folder outside it: (access, root, outside).
fn layout(dir: &Path) -> (AdminAccess, PathBuf, PathBuf) {
    let root = dir.join("models");
    let outside = dir.join("private");
    std::fs::create_dir_all(root.join("bert")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let config = AdminConfig {
        key: "admin".into(),
        model_roots: vec![root.clone()],
    };
    (AdminAccess::new(&config).unwrap(), root, outside)
}

fn assert_outside(answer: Result<PathBuf, AccessError>) {
    match answer {
        Err(error @ AccessError::OutsideRoots { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("outside the server's model roots"),
                "{message}"
            );
            assert!(message.contains("admin.model_roots"), "{message}");
        }
        other => panic!("expected OutsideRoots, got {other:?}"),
    }
}

#[test]
fn a_folder_under_a_root_is_loaded_by_its_canonical_path() {
    // Proves the check lets a model under a root through, `..` that stays inside
    // included, and hands back the resolved path the load opens.
    let dir = tempfile::tempdir().unwrap();
    let (access, root, _) = layout(dir.path());
    let canonical = root.join("bert").canonicalize().unwrap();
    assert_eq!(
        access.confine("folder", &root.join("bert")).unwrap(),
        canonical
    );
    let roundabout = root.join("bert").join("..").join("bert");
    assert_eq!(access.confine("folder", &roundabout).unwrap(), canonical);
}

#[test]
fn dot_dot_out_of_a_root_is_refused() {
    // Proves `ROOT/../private` does not pass as "under ROOT" by its spelling.
    let dir = tempfile::tempdir().unwrap();
    let (access, root, _) = layout(dir.path());
    assert_outside(access.confine("folder", &root.join("..").join("private")));
}

#[cfg(unix)]
#[test]
fn a_symlink_in_a_root_to_a_folder_outside_is_refused() {
    // Proves a link placed under a root cannot lead a load out of it.
    let dir = tempfile::tempdir().unwrap();
    let (access, root, outside) = layout(dir.path());
    let link = root.join("escape");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    assert_outside(access.confine("folder", &link));
}

#[test]
fn an_absolute_path_outside_every_root_is_refused() {
    // Proves an absolute folder elsewhere (here the temp folder's sibling, and a
    // root's own parent) is refused, and that a root's name as a prefix is not enough.
    let dir = tempfile::tempdir().unwrap();
    let (access, root, outside) = layout(dir.path());
    assert_outside(access.confine("folder", &outside));
    assert_outside(access.confine("folder", dir.path()));
    let sibling = dir.path().join("models2");
    std::fs::create_dir_all(&sibling).unwrap();
    assert!(sibling
        .to_string_lossy()
        .starts_with(&*root.to_string_lossy()));
    assert_outside(access.confine("folder", &sibling));
}

#[test]
fn a_missing_folder_is_named() {
    // Proves a path that does not exist is refused with the field and the path.
    let dir = tempfile::tempdir().unwrap();
    let (access, root, _) = layout(dir.path());
    let error = access.confine("folder", &root.join("absent")).unwrap_err();
    assert!(matches!(error, AccessError::Missing { .. }), "{error:?}");
    assert!(error.to_string().starts_with("folder: "), "{error}");
}

#[test]
fn lora_files_are_confined_like_the_folder() {
    // Proves a model under a root cannot bring an adapter file from outside.
    let dir = tempfile::tempdir().unwrap();
    let (access, root, outside) = layout(dir.path());
    std::fs::write(outside.join("a.safetensors"), b"x").unwrap();
    std::fs::write(root.join("b.safetensors"), b"x").unwrap();
    let mut model = ModelConfig::from_folder(&root.join("bert"));
    model.adapters.insert(
        "inside".into(),
        format!("{}:0.5", root.join("b.safetensors").display()),
    );
    let confined = access.confine_model(model.clone()).unwrap();
    assert!(confined.adapters["inside"].ends_with("b.safetensors:0.5"));
    model.lora = vec![outside.join("a.safetensors").display().to_string()];
    match access.confine_model(model) {
        Err(AccessError::OutsideRoots { key, .. }) => assert_eq!(key, "lora"),
        other => panic!("expected OutsideRoots, got {other:?}"),
    }
}

#[test]
fn keys_match_only_when_equal() {
    // Proves the constant-time comparison is still a comparison.
    assert!(keys_match(b"secret", b"secret"));
    assert!(!keys_match(b"secreT", b"secret"));
    assert!(!keys_match(b"secret!", b"secret"));
    assert!(!keys_match(b"secre", b"secret"));
    assert!(!keys_match(b"", b"secret"));
    assert!(!keys_match(b"secret\0", b"secret"));
}

#[test]
fn admin_table_mistakes_are_refused_naming_the_key() {
    // Proves the config checks: an empty admin key, the API key reused as the admin
    // key, no model root, a root that is not a folder, and an unknown key.
    use crate::serve::config::ServeConfig;
    let dir = tempfile::tempdir().unwrap();
    let (_, root, _) = layout(dir.path());
    let with_admin = |key: &str, roots: Vec<PathBuf>| ServeConfig {
        api_key: Some("client".into()),
        admin: Some(AdminConfig {
            key: key.into(),
            model_roots: roots,
        }),
        models: vec![ModelConfig::from_folder(&root.join("bert"))],
        ..ServeConfig::default()
    };
    assert_eq!(with_admin("admin", vec![root.clone()]).validate(), Ok(()));
    let cases = [
        (with_admin("", vec![root.clone()]), "admin.key is empty"),
        (
            with_admin("client", vec![root.clone()]),
            "admin.key is the api_key",
        ),
        (
            with_admin("admin", Vec::new()),
            "admin.model_roots is empty",
        ),
        (
            with_admin("admin", vec![root.join("absent")]),
            "admin.model_roots: ",
        ),
    ];
    for (config, needle) in cases {
        let error = config.validate().unwrap_err();
        assert!(error.contains(needle), "{needle:?} in {error:?}");
    }
    let text = "[admin]\nkey = \"a\"\nmodel_roots = []\nroot = \"/\"\n";
    let error = toml::from_str::<ServeConfig>(text).unwrap_err();
    assert!(error.message().contains("root"), "{}", error.message());
}
