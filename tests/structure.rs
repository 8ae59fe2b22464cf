//! The shape of the code, checked from its own text (docs/architecture.md, "Architecture"): the
//! modules of `src/` form layers that import only downwards, with no circle between
//! them, and library files and functions stay short enough to read.
//!
//! Only non-test code counts: `#[cfg(test)]` items, `tests.rs`/`*_tests.rs` files and
//! comments are left out before the imports are read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom up. A module may import modules of its own layer or below;
/// an import of a higher layer is an error, and so is a circle inside a layer.
const LAYERS: &[(&str, &[&str])] = &[
    ("the operating system", &["os", "signals"]),
    (
        "ports and the model index",
        &["compute", "settings", "model"],
    ),
    ("adapters", &["device", "storage", "telemetry", "sim"]),
    ("model families", &["families", "lora"]),
    ("the run", &["run"]),
    (
        "tools over runs",
        &["simulate", "calibrate", "validate", "pipeline"],
    ),
    // The top layer, beside the CLI (which is not a library module).
    ("serving", &["serve"]),
];

/// Library files longer than this are split along their seams.
const MAX_FILE_LINES: usize = 500;
/// Library functions longer than this are split into named steps.
const MAX_FUNCTION_LINES: usize = 100;

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn is_test_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .map_or(String::new(), |name| name.to_string_lossy().into_owned());
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The text without comments, string contents, and `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let without_comments = strip_comments_and_strings(text);
    strip_test_items(&without_comments)
}

fn strip_comments_and_strings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < bytes.len() {
        let rest = &text[at..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(text.len(), |end| at + end);
            at = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(text.len(), |end| at + end + 2);
            out.extend(text[at..end].chars().filter(|&c| c == '\n'));
            at = end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let close = if rest.starts_with("r#") { "\"#" } else { "\"" };
            let open = if rest.starts_with("r#") { 3 } else { 2 };
            let end = rest[open..]
                .find(close)
                .map_or(text.len(), |end| at + open + end + close.len());
            out.push_str("\"\"");
            out.extend(text[at..end].chars().filter(|&c| c == '\n'));
            at = end;
        } else if rest.starts_with('"') {
            let mut end = at + 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            out.extend(text[at..end.min(text.len())].chars().filter(|&c| c == '\n'));
            at = (end + 1).min(text.len());
        } else if let Some(length) = char_literal_length(rest) {
            // A char literal ('{', '"', '\''): its content is not code. A lifetime
            // ('a) has no closing quote right after one character.
            at += length;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            at += c.len_utf8();
        }
    }
    out
}

/// The length of the char literal `text` starts with (`'x'`, `'\n'`, `'\u{7f}'`),
/// or `None` when it starts with none (a lifetime, or not a quote at all).
fn char_literal_length(text: &str) -> Option<usize> {
    let mut chars = text.char_indices();
    if chars.next()?.1 != '\'' {
        return None;
    }
    let (_, first) = chars.next()?;
    if first == '\\' {
        let close = text[1..]
            .char_indices()
            .skip(2)
            .find(|&(_, c)| c == '\'')?
            .0;
        return (close <= 10).then_some(close + 2);
    }
    let (at, next) = chars.next()?;
    (next == '\'').then_some(at + 1)
}

/// Removes every item that follows `#[cfg(test)]`: up to its `;` or its closing brace.
fn strip_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(found) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..found]);
        let item = &rest[found..];
        let brace = item.find('{');
        let semicolon = item.find(';');
        let end = match (brace, semicolon) {
            (Some(brace), Some(semicolon)) if semicolon < brace => semicolon + 1,
            (Some(brace), _) => brace + matching_brace(&item[brace..]),
            (None, Some(semicolon)) => semicolon + 1,
            (None, None) => item.len(),
        };
        out.extend(item[..end].chars().filter(|&c| c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The length of the braced group `text` starts with, closing brace included.
fn matching_brace(text: &str) -> usize {
    let mut depth = 0usize;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return at + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The top-level module a file of `src/` belongs to (`None`: lib.rs, main.rs, the CLI).
fn module_of(root: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix(root).ok()?;
    let first = relative.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// Every `crate::module` a library file names, with the files that name it.
fn imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let root = source_root();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for path in rust_files(&root) {
        let Some(module) = module_of(&root, &path) else {
            continue;
        };
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file is readable");
        let code = code_of(&text);
        let file = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        for (at, _) in code.match_indices("crate::") {
            let name: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != module && layer_of(&name).is_some() {
                graph
                    .entry(module.clone())
                    .or_default()
                    .entry(name)
                    .or_default()
                    .insert(file.clone());
            }
        }
        graph.entry(module).or_default();
    }
    graph
}

#[test]
fn every_module_of_src_has_a_layer() {
    let root = source_root();
    let unplaced: BTreeSet<String> = rust_files(&root)
        .iter()
        .filter_map(|path| module_of(&root, path))
        .filter(|module| module != "cli" && layer_of(module).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/structure.rs LAYERS (add them, and to docs/architecture.md \"Architecture\"): {unplaced:?}"
    );
}

#[test]
fn no_module_imports_a_higher_layer() {
    let mut wrong = Vec::new();
    for (module, targets) in imports() {
        let Some(layer) = layer_of(&module) else {
            continue;
        };
        for (target, files) in targets {
            let Some(target_layer) = layer_of(&target) else {
                continue;
            };
            if target_layer > layer {
                wrong.push(format!(
                    "{module} ({}) imports {target} ({}) in {files:?}",
                    LAYERS[layer].0, LAYERS[target_layer].0
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run up the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_modules_import_each_other_in_no_circle() {
    let graph = imports();
    // Depth-first search; a grey node met again closes a circle.
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|seen| seen == module) {
            let mut circle = path[start..].to_vec();
            circle.push(module.to_string());
            return Some(circle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for target in graph.get(module).into_iter().flat_map(BTreeMap::keys) {
            if let Some(circle) = visit(target, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(circle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            let edges: Vec<String> = circle
                .windows(2)
                .map(|pair| {
                    format!(
                        "{} -> {} in {:?}",
                        pair[0], pair[1], graph[&pair[0]][&pair[1]]
                    )
                })
                .collect();
            panic!("a circle of imports:\n{}", edges.join("\n"));
        }
    }
}

#[test]
fn library_files_stay_under_the_line_limit() {
    let long: Vec<String> = library_files()
        .into_iter()
        .filter_map(|(path, text)| {
            let lines = text.lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:?}"
    );
}

#[test]
fn library_functions_stay_under_the_line_limit() {
    let mut long = Vec::new();
    for (path, text) in library_files() {
        let code = code_of(&text);
        for (name, lines) in function_lengths(&code) {
            if lines > MAX_FUNCTION_LINES {
                long.push(format!("{}: fn {name} ({lines} lines)", path.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// Library code: `src/` and `actors/src/`, without test files.
fn library_files() -> Vec<(PathBuf, String)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    [manifest.join("src"), manifest.join("actors/src")]
        .iter()
        .flat_map(|root| rust_files(root))
        .filter(|path| !is_test_file(path))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a source file is readable");
            let shown = path.strip_prefix(manifest).unwrap_or(&path).to_path_buf();
            (shown, text)
        })
        .collect()
}

/// Each `fn` with a body, and the lines from its signature to its closing brace.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let rest = &code[at..];
        let (Some(brace), semicolon) = (rest.find('{'), rest.find(';')) else {
            continue;
        };
        if semicolon.is_some_and(|semicolon| semicolon < brace) {
            continue; // a declaration without a body
        }
        let end = brace + matching_brace(&rest[brace..]);
        found.push((name, rest[..end].lines().count()));
    }
    found
}
