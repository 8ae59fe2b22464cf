//! `stagehand help` and `stagehand bench help` as users call them: each subcommand's
//! help by name, and an unknown name refused with exit 2 naming it; plus `--help` and
//! `--version` of the program itself.

mod common;

use common::cli::{row, Expect, Table};

#[test]
fn help_names_every_subcommand_and_refuses_unknown_ones() {
    Table::new("help", file!())
        .rows([
            row(&[], Expect::Ok("Usage: stagehand")),
            row(&["generate"], Expect::Ok("Usage: stagehand generate")),
            row(
                &["bench", "disk"],
                Expect::Ok("Usage: stagehand bench disk"),
            ),
            row(&["nosuch"], Expect::Bad("'nosuch'")),
            row(&["--help"], Expect::Bad("'--help'")),
        ])
        .run();
}

#[test]
fn bench_help_names_its_modes() {
    Table::new("bench help", file!())
        .rows([
            row(&[], Expect::Ok("Usage: stagehand bench")),
            row(&["lora"], Expect::Ok("Usage: stagehand bench lora")),
            row(&["disk"], Expect::Ok("Usage: stagehand bench disk")),
            row(&["cuda"], Expect::Bad("'cuda'")),
        ])
        .run();
}
