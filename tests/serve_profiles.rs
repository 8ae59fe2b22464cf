//! The shipped serve profiles (`config/profiles/serve-*.toml`) read and validate: every
//! key known, the settings file they name present, the budgets parseable.
#![cfg(feature = "serve")]

mod common;

use stagehand::serve::ServeConfig;

#[test]
fn every_serve_profile_reads_and_validates_once_its_folders_exist() {
    // Proves a typo or a stale key in a shipped profile fails here, not for a user.
    let profiles = common::metrics::repo_path("config/profiles");
    let mut read = 0;
    for entry in std::fs::read_dir(&profiles).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("serve-") {
            continue;
        }
        let mut config = ServeConfig::read(&entry.path()).unwrap_or_else(|error| panic!("{error}"));
        let settings = config
            .settings
            .clone()
            .expect("a serve profile names its settings file");
        assert!(
            settings.is_file(),
            "{name}: {} is missing",
            settings.display()
        );
        assert!(
            config.models.len() >= 2,
            "{name}: an embedder and a decoder"
        );
        // The folders are the user's; point them at an existing folder to validate the rest.
        let dir = tempfile::tempdir().unwrap();
        for model in &mut config.models {
            model.folder = dir.path().to_path_buf();
            for budget in [&model.vram_budget, &model.pin_ceiling]
                .into_iter()
                .flatten()
            {
                assert!(
                    budget.parse::<bytesize::ByteSize>().is_ok(),
                    "{name}: {budget}"
                );
            }
        }
        config
            .validate()
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        read += 1;
    }
    assert_eq!(read, 2, "serve-cpu.toml and serve-gpu-24gb.toml");
}
