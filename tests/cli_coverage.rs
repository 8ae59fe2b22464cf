//! The CLI tables cover the command line as documented: every subcommand `stagehand
//! --help` lists (at any depth) has a table (tests/common/cli.rs `TABLES`), every table
//! listed is still a subcommand, and every command README.md and the pages of docs/
//! show names a subcommand that exists and flags it documents — in the `--help` of
//! the subcommand its example names (`stagehand SUB ... --flag`), or of some
//! subcommand for flags the prose mentions alone. A flag a `--help` documents is then
//! tried by that subcommand's table (each table checks its own), so every command a
//! page shows is run, flag by flag, by the CLI tables.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::cli::{documented_flags, flags_in, subcommands_of, TABLES};

/// Every subcommand, as its words after `stagehand` ("" is plain `stagehand`).
fn every_subcommand() -> Vec<String> {
    let mut found = vec![String::new()];
    let mut next = 0;
    while next < found.len() {
        let subcommand = found[next].clone();
        next += 1;
        if subcommand.split_whitespace().last() != Some("help") {
            found.extend(subcommands_of(&subcommand));
        }
    }
    found
}

#[test]
fn every_subcommand_has_a_table_and_every_table_a_subcommand() {
    let subcommands = every_subcommand();
    let untabled: Vec<String> = subcommands
        .iter()
        .filter(|subcommand| !TABLES.iter().any(|(listed, _)| listed == subcommand))
        .map(|subcommand| {
            let file = format!("tests/cli_{}.rs", subcommand.replace([' ', '-'], "_"));
            format!(
                "`stagehand {subcommand}` has no table: write {file} with a Table::new(\"{subcommand}\", file!()) \
                 and add (\"{subcommand}\", \"{file}\") to TABLES in tests/common/cli.rs"
            )
        })
        .collect();
    assert!(untabled.is_empty(), "{}", untabled.join("\n"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (subcommand, file) in TABLES {
        assert!(
            subcommands.iter().any(|listed| listed == subcommand),
            "TABLES (tests/common/cli.rs) lists `stagehand {subcommand}`, which `--help` no longer lists: remove it and {file}"
        );
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
        assert!(
            text.contains(&format!("Table::new(\"{subcommand}\"")) || text.contains("fn table(subcommand"),
            "TABLES names {file} for `stagehand {subcommand}`, but that file builds no Table for it"
        );
    }
}

/// Code spans (`...`) and code-block lines of a Markdown page.
fn code_of(readme: &str) -> Vec<String> {
    let mut code = Vec::new();
    let mut fenced = false;
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") {
            code.push(line.trim().to_string());
            continue;
        }
        code.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
    }
    code
}

/// The subcommand a `stagehand ...` example names (the longest that exists), if any.
fn named_subcommand(example: &str, subcommands: &[String]) -> Option<String> {
    let words: Vec<&str> = example.split_whitespace().collect();
    if words.first() != Some(&"stagehand") {
        return None;
    }
    let mut named = String::new();
    for word in &words[1..] {
        let longer = format!("{named} {word}").trim().to_string();
        if !subcommands.contains(&longer) {
            break;
        }
        named = longer;
    }
    Some(named)
}

/// Other programs' flags the pages mention (cargo's, in the test instructions).
const NOT_STAGEHAND: &[&str] = &[
    "--release",
    "--workspace",
    "--no-fail-fast",
    "--test",
    "--include-ignored",
    "--all-targets",
    "--check",
    "--no-default-features",
];

/// README.md and every page of docs/, by path, so a new page is checked too.
fn documentation() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
        .into_iter()
        .map(|page| {
            let text = std::fs::read_to_string(root.join(&page)).expect("a documentation page");
            (page, text)
        })
        .collect()
}

/// Other programs' command lines (cargo, scripts, the deployment's shell, Python,
/// kubectl, curl) carry their own flags.
fn other_program(first: &str) -> bool {
    first.starts_with("cargo")
        || first.starts_with("scripts/")
        || first.contains('=')
        || [
            "cd", "python", "pip", "kubectl", "docker", "curl", "$", "OUT",
        ]
        .contains(&first)
}

#[test]
fn every_flag_the_documentation_shows_exists_where_it_says() {
    let subcommands = every_subcommand();
    let defined: Vec<(String, Vec<String>)> = subcommands
        .iter()
        .map(|subcommand| (subcommand.clone(), documented_flags(subcommand)))
        .collect();
    let defines = |subcommand: &str, flag: &String| {
        defined
            .iter()
            .any(|(name, flags)| name == subcommand && flags.contains(flag))
    };
    let mut wrong = BTreeSet::new();
    for (page, text) in documentation() {
        for span in code_of(&text) {
            // A shell prompt's `$ ` is not part of the command.
            let span = span.strip_prefix("$ ").unwrap_or(&span).to_string();
            let words: Vec<&str> = span.split_whitespace().collect();
            if words.first().is_some_and(|first| other_program(first)) {
                continue;
            }
            if let Some(unknown) = unknown_subcommand(&words, &subcommands) {
                wrong.insert(format!(
                    "{page}'s `{span}` runs `stagehand {unknown}`, which `stagehand --help` does not list"
                ));
            }
            for flag in flags_in(&span) {
                if NOT_STAGEHAND.contains(&flag.as_str()) {
                    continue;
                }
                match named_subcommand(&span, &subcommands) {
                    // `stagehand run --lora ...`: run's own flag (plain `stagehand` is run's flags too).
                    Some(subcommand) if !defines(&subcommand, &flag) => {
                        wrong.insert(format!(
                            "{page}'s `{span}` uses {flag}, which `stagehand {subcommand} --help` does not document"
                        ));
                    }
                    Some(_) => {}
                    None if !defined.iter().any(|(_, flags)| flags.contains(&flag)) => {
                        wrong.insert(format!(
                            "{page} mentions {flag} (in `{span}`), which no subcommand's --help documents"
                        ));
                    }
                    None => {}
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "fix the page, or the flag, then add its rows to the subcommand's table:\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The word after `stagehand` when it is neither a subcommand nor a flag nor a
/// placeholder (`stagehand simualte`), if the words are a `stagehand` command line:
/// two words, or a line with flags (a line of output such as `stagehand vs naive
/// (…): 1.32× faster` is neither).
fn unknown_subcommand(words: &[&str], subcommands: &[String]) -> Option<String> {
    let command_line = words.len() == 2 || words.iter().any(|word| word.starts_with("--"));
    if words.first() != Some(&"stagehand") || !command_line {
        return None;
    }
    let next = words.get(1)?;
    let plain_word = next.chars().all(|c| c.is_ascii_lowercase() || c == '-');
    if next.starts_with('-') || !plain_word || subcommands.iter().any(|name| name == next) {
        return None;
    }
    Some(next.to_string())
}

#[test]
fn a_page_that_shows_a_flag_that_does_not_exist_fails() {
    // Proves the check above reads docs/ pages as it reads README.md: a made-up flag
    // and a made-up subcommand in a page's command are both found.
    let subcommands = every_subcommand();
    let page = "Run it:\n\n    stagehand simulate --model flux1-dev --no-such-flag\n\nor `stagehand simualte`.\n";
    let spans = code_of(page);
    let shown: Vec<String> = spans.iter().flat_map(|span| flags_in(span)).collect();
    assert!(shown.contains(&"--no-such-flag".to_string()), "{shown:?}");
    assert!(!documented_flags("simulate").contains(&"--no-such-flag".to_string()));
    let typo = spans.iter().find_map(|span| {
        unknown_subcommand(&span.split_whitespace().collect::<Vec<_>>(), &subcommands)
    });
    assert_eq!(typo.as_deref(), Some("simualte"));
}
