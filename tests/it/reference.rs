//! The manual's reference tables are made from the code: the files under
//! `docs/src/reference/` are what `docstream reference TABLE` prints now,
//! byte for byte. A setting, metric or command added, renamed or described
//! anew without them fails here, and the message says how to make them
//! again: `DOCSTREAM_UPDATE_DOCS=1 cargo test --test it reference::`.

use std::path::Path;

const TABLES: [&str; 4] = ["settings", "limits", "metrics", "commands"];

#[test]
fn the_reference_tables_are_what_the_code_says() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/reference");
    let update = std::env::var("DOCSTREAM_UPDATE_DOCS").as_deref() == Ok("1");
    let mut stale = Vec::new();
    for table in TABLES {
        let printed = printed(table);
        let path = dir.join(format!("{table}.md"));
        if update {
            std::fs::write(&path, &printed).expect("write the table");
            eprintln!("reference: wrote {}", path.display());
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        if checked_in != printed {
            let line = checked_in
                .lines()
                .zip(printed.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(checked_in.lines().count().min(printed.lines().count()));
            stale.push(format!(
                "docs/src/reference/{table}.md, from line {}: {:?} in the code, {:?} checked in",
                line + 1,
                printed.lines().nth(line).unwrap_or("<end>"),
                checked_in.lines().nth(line).unwrap_or("<end>"),
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "the manual's reference tables differ from the code:\n  {}\n\nIf the code changed on \
         purpose, make them again with\n\n    DOCSTREAM_UPDATE_DOCS=1 cargo test --test it \
         reference::\n\nand commit the files.",
        stale.join("\n  ")
    );
}

/// What `docstream reference TABLE` prints, from an empty environment: the
/// tables give the defaults, whatever the test's settings are.
fn printed(table: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_docstream"))
        .args(["reference", table])
        .env_clear()
        .output()
        .expect("run docstream reference");
    assert!(
        output.status.success(),
        "docstream reference {table} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("Markdown is UTF-8")
}
