//! `docstream reference TABLE`: the manual's reference tables, made from the
//! code, so that they cannot drift from it: the settings (from the
//! `settings!` declarations and their doc comments), the metrics (from their
//! registrations) and the commands (from the command line's own
//! definition). The files under `docs/src/reference/` are its output, and a
//! test fails when they differ from what it prints now.

use clap::{Arg, ArgAction, Command as Clap};
use docstream::config::{Described, ExtractorSettings, Settings};
use docstream::metrics::Metrics;

/// A table of the manual.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Table {
    /// Every setting but the limits, by section.
    Settings,
    /// The settings of the section "Limits".
    Limits,
    /// Every metric a process exports.
    Metrics,
    /// Every command and its arguments.
    Commands,
}

/// The section of the settings that the limits chapter lists.
const LIMITS: &str = "Limits";

/// `table` as Markdown; `cli` is the command line's definition.
pub fn render(table: Table, cli: &Clap) -> String {
    let mut out = String::from(
        "<!-- Made by `docstream reference`: edit the code, then run\n     \
         DOCSTREAM_UPDATE_DOCS=1 cargo test --test it reference:: -->\n\n",
    );
    match table {
        Table::Settings => settings(&mut out, |section| section != LIMITS),
        Table::Limits => settings(&mut out, |section| section == LIMITS),
        Table::Metrics => metrics(&mut out),
        Table::Commands => commands(&mut out, cli),
    }
    out
}

/// The settings of the sections `wanted` picks, a table per section; the
/// external extractors' settings after the last one.
fn settings(out: &mut String, wanted: impl Fn(&str) -> bool) {
    let described = Settings::described();
    let mut sections: Vec<&str> = described.iter().map(|(section, _)| *section).collect();
    sections.dedup();
    let titled = sections.iter().filter(|s| wanted(s)).count() > 1;
    for section in sections.into_iter().filter(|s| wanted(s)) {
        if titled {
            out.push_str(&format!("## {section}\n\n"));
        }
        let rows = described
            .iter()
            .filter(|(s, _)| *s == section)
            .map(|(_, d)| d);
        settings_table(out, rows);
    }
    if wanted("External extractors") {
        out.push_str("## External extractors\n\n");
        out.push_str(
            "`DOCSTREAM_EXTRACTORS` names them, comma-separated (empty by default: the \
             built-in rules need none); each then has these, with its name in upper case \
             (`-` as `_`) for `<NAME>`:\n\n",
        );
        settings_table(out, ExtractorSettings::described().iter());
    }
}

fn settings_table<'a>(out: &mut String, rows: impl Iterator<Item = &'a Described>) {
    out.push_str("| variable | default | what it is for |\n|---|---|---|\n");
    for row in rows {
        let default = match row.default.as_str() {
            "" => "empty".to_owned(),
            value => format!("`{value}`"),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            row.var,
            cell(&default),
            cell(&plain(&row.doc))
        ));
    }
    out.push('\n');
}

/// Every metric a process registers, a pool's included.
fn metrics(out: &mut String) {
    let metrics = Metrics::new();
    metrics.register(Box::new(docstream::metrics::PoolCollector::new(
        sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://localhost/described")
            .expect("a valid URL"),
    )));
    out.push_str("| metric | type | labels | what it counts |\n|---|---|---|---|\n");
    for metric in metrics.described() {
        let labels: Vec<String> = metric.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            metric.name,
            metric.kind,
            labels.join(", "),
            cell(&metric.help)
        ));
    }
}

/// Each visible command, with what it does and its arguments.
fn commands(out: &mut String, cli: &Clap) {
    let global: Vec<&Arg> = cli.get_arguments().filter(|a| shown(a)).collect();
    out.push_str("Every command takes ");
    let globals: Vec<String> = global
        .iter()
        .map(|a| format!("`{}` ({})", usage(a), sentence(a)))
        .collect();
    out.push_str(&globals.join(", "));
    out.push_str(".\n\n");
    for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        command_section(out, &["docstream"], command);
    }
}

fn command_section(out: &mut String, parents: &[&str], command: &Clap) {
    let mut path = parents.to_vec();
    path.push(command.get_name());
    if command.has_subcommands() {
        for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
            command_section(out, &path, sub);
        }
        return;
    }
    let args: Vec<&Arg> = command
        .get_arguments()
        .filter(|a| shown(a) && !a.is_global_set())
        .collect();
    out.push_str(&format!("## `{}`\n\n", path.join(" ")));
    let about = command
        .get_long_about()
        .or(command.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default();
    out.push_str(&format!("{}\n\n", full_stop(&about)));
    if args.is_empty() {
        return;
    }
    out.push_str("| argument | what it is |\n|---|---|\n");
    for arg in args {
        out.push_str(&format!(
            "| `{}` | {} |\n",
            usage(arg),
            cell(&sentence(arg))
        ));
    }
    out.push('\n');
}

/// Whether the manual lists `arg`: not the `--help` and `--version` clap adds.
fn shown(arg: &Arg) -> bool {
    !arg.is_hide_set()
        && !matches!(
            arg.get_action(),
            ArgAction::Help | ArgAction::HelpLong | ArgAction::HelpShort | ArgAction::Version
        )
}

/// How `arg` is written: `--name <VALUE>`, `--flag` or `<ID>`.
fn usage(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(|name| name.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
    match arg.get_long() {
        None => format!("<{value}>"),
        Some(long) if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::Count) => {
            format!("--{long}")
        }
        Some(long) => format!("--{long} <{value}>"),
    }
}

/// What `arg` is, with its default, its choices and its variable.
fn sentence(arg: &Arg) -> String {
    let mut text = full_stop(
        &arg.get_long_help()
            .or(arg.get_help())
            .map(|s| s.to_string())
            .unwrap_or_default(),
    );
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue) {
        text.push_str(&format!(" Default: `{}`.", defaults.join(",")));
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !choices.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue) {
        text.push_str(&format!(" One of {}.", choices.join(", ")));
    }
    if let Some(var) = arg.get_env() {
        text.push_str(&format!(" Also `{}`.", var.to_string_lossy()));
    }
    text.trim().to_owned()
}

/// `text` ending in a full stop: clap takes the last one off a doc comment.
fn full_stop(text: &str) -> String {
    let text = text.trim();
    match text.chars().last() {
        None | Some('.' | '!' | '?' | ':') => text.to_owned(),
        Some(_) => format!("{text}."),
    }
}

/// `text` fit for a table cell: one line, its pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// A doc comment's intra-doc links as plain code: "[`Seconds`]" reads
/// "`Seconds`".
fn plain(doc: &str) -> String {
    doc.replace("[`", "`").replace("`]", "`")
}
