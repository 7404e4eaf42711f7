//! The Postgres ceiling: pgbench running docstream's own lifecycle statements
//! (`bench_support::lifecycle`: insert, claim, complete), each in its own transaction as
//! a one-commit-per-transition pipeline would, with one row per statement and
//! with many. A lifecycle is one job inserted, claimed and completed.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use tokio::process::Command;

use docstream::bench_support::lifecycle;

/// One pgbench run.
#[derive(Debug, Clone, Serialize)]
pub struct PgCeiling {
    /// Rows each statement moves.
    pub rows_per_statement: usize,
    /// pgbench clients.
    pub clients: usize,
    /// Seconds pgbench ran.
    pub seconds: u64,
    /// Scripts (insert + claim + complete) per second, as pgbench reports.
    pub scripts_per_s: f64,
    /// Jobs taken through insert, claim and complete per second.
    pub lifecycles_per_s: f64,
}

/// The pgbench script for `rows` rows per statement: the ids are drawn first
/// (a read, no commit), then the three statements run on them, binding arrays
/// exactly as docstream does.
fn script(rows: usize) -> String {
    let fill = |value: &str| format!("array_fill({value}, ARRAY[{rows}])");
    let bind = |sql: &str, args: &[String]| {
        // Highest first, so `$1` never eats the start of `$10`.
        args.iter()
            .enumerate()
            .rev()
            .fold(sql.to_owned(), |sql, (i, arg)| {
                sql.replace(&format!("${}", i + 1), arg)
            })
    };
    let ids = ":ids".to_owned();
    let insert = bind(
        lifecycle::INSERT,
        &[
            ids.clone(),
            fill("NULL::text"),
            fill("'pgbench'::text"),
            fill(":request::text"),
            fill("false"),
            fill("'00000000-0000-0000-0000-000000000000'::uuid"),
            fill("NULL::int8"),
            fill("'normal'::text"),
        ],
    );
    let claim = bind(lifecycle::CLAIM, &[ids.clone(), "30".into()]);
    let complete = bind(
        lifecycle::COMPLETE,
        &[ids, fill("1"), fill(":result::text")],
    );
    format!(
        "SELECT array_agg(gen_random_uuid()) AS ids FROM generate_series(1, {rows}) \\gset\n\
         {insert};\n{claim};\n{complete};\n"
    )
}

/// Runs pgbench for `seconds` with `clients` on `database_url`, whose
/// `extractions` table it fills (use a scratch database).
pub async fn ceiling(
    database_url: &str,
    rows: usize,
    clients: usize,
    seconds: u64,
    request: &serde_json::Value,
    result: &serde_json::Value,
    workdir: &Path,
) -> anyhow::Result<PgCeiling> {
    let file = workdir.join(format!("pgbench-{rows}.sql"));
    std::fs::write(&file, script(rows))?;
    let output = Command::new(pgbench())
        .args(["--no-vacuum", "--protocol=prepared"])
        .arg(format!("--client={clients}"))
        .arg(format!("--jobs={}", clients.min(2)))
        .arg(format!("--time={seconds}"))
        .arg(format!("--define=request={request}"))
        .arg(format!("--define=result={result}"))
        .arg(format!("--file={}", file.display()))
        .arg(database_url)
        .output()
        .await
        .context("running pgbench (Debian package postgresql-client)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    let failed = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("number of failed transactions:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    anyhow::ensure!(
        failed == 0,
        "pgbench: {failed} transactions failed:\n{stdout}"
    );
    let scripts_per_s: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no tps in pgbench output:\n{stdout}"))?;
    Ok(PgCeiling {
        rows_per_statement: rows,
        clients,
        seconds,
        scripts_per_s,
        lifecycles_per_s: scripts_per_s * rows as f64,
    })
}

/// `pgbench` from PATH, else the one the Postgres server package ships.
fn pgbench() -> String {
    let server = "/usr/lib/postgresql/15/bin/pgbench";
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("pgbench").exists()));
    if on_path || !Path::new(server).exists() {
        "pgbench".into()
    } else {
        server.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_binds_every_placeholder() {
        for rows in [1, 100] {
            let script = script(rows);
            assert!(!script.contains('$'), "unbound placeholder in:\n{script}");
            // Insert (after the line that makes the ids), claim and complete.
            let statements: Vec<&str> = script
                .split(";\n")
                .filter(|s| !s.trim().is_empty())
                .collect();
            assert_eq!(statements.len(), 3, "{script}");
            assert!(statements.iter().all(|s| s.contains(":ids")), "{script}");
            assert!(script.contains(&format!("ARRAY[{rows}]")));
        }
    }
}
