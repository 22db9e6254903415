//! Help beyond clap's defaults: an example on every command (the table in
//! examples.rs, added to the long help of each command that has none of its
//! own), shell completions (clap_complete) and man pages (clap_mangen),
//! all from the one command definition.

use anyhow::{Context, Result};
use clap::CommandFactory;
use std::path::Path;

#[path = "help_examples.rs"]
mod examples;

/// The command line with the examples added.
pub fn command() -> clap::Command {
    add_examples(crate::args::Cli::command(), "")
}

fn add_examples(mut cmd: clap::Command, path: &str) -> clap::Command {
    let has = |c: &clap::Command| {
        let own = [c.get_after_help(), c.get_after_long_help()];
        own.iter()
            .flatten()
            .any(|s| s.to_string().contains("Example"))
    };
    if !has(&cmd) {
        if let Some(e) = examples::for_path(path) {
            cmd = cmd.after_long_help(format!("Examples:\n{e}"));
        }
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for n in names {
        let sub = if path.is_empty() {
            n.clone()
        } else {
            format!("{path} {n}")
        };
        cmd = cmd.mut_subcommand(&n, |s| add_examples(s, &sub));
    }
    cmd
}

/// `cairn completions SHELL`: the script on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut cmd = command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "cairn", &mut buf);
    to_stdout(&buf)
}

/// Writes `b` to stdout; a reader that stopped reading (`| head`) ends the
/// output quietly, as it does for other Unix tools, not with a panic.
fn to_stdout(b: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(b).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r.context("writing to stdout")?),
    }
}

/// `cairn man --dir DIR`: cairn.1 and cairn-SUB[-SUB].1 for every command.
pub fn man(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    let cmd = command();
    let n = write_pages(&cmd, "cairn", dir)?;
    println!("wrote {n} man pages to {}", dir.display());
    Ok(())
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> Result<usize> {
    let page = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let mut buf = Vec::new();
    clap_mangen::Man::new(page).render(&mut buf)?;
    let file = dir.join(format!("{name}.1"));
    std::fs::write(&file, buf).with_context(|| format!("{}", file.display()))?;
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        n += write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(n)
}

/// The paths of the commands without subcommands ("snapshot create").
#[cfg(test)]
pub fn leaves(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    if cmd.get_subcommands().next().is_none() {
        out.push((path.to_string(), cmd.clone()));
    }
    for s in cmd.get_subcommands() {
        let p = if path.is_empty() {
            s.get_name().to_string()
        } else {
            format!("{path} {}", s.get_name())
        };
        leaves(s, &p, out);
    }
}

#[cfg(test)]
mod tests {
    /// Every command a user can run has an example in its long help.
    #[test]
    fn every_leaf_has_an_example() {
        let mut cmd = super::command();
        cmd.build();
        let mut all = Vec::new();
        super::leaves(&cmd, "", &mut all);
        let mut missing = Vec::new();
        for (path, mut c) in all {
            // clap's generated `help` subcommands are not commands.
            let generated = path.split(' ').any(|w| w == "help");
            if path.is_empty() || c.is_hide_set() || generated {
                continue;
            }
            let help = c.render_long_help().to_string();
            if !help.contains("Example") {
                missing.push(path);
            }
        }
        assert!(all_ok(&missing), "commands without an example: {missing:?}");
    }

    /// docs/commands.md and the commands the binary knows name the same
    /// commands: a command added, renamed or dropped on one side only
    /// fails here.
    #[test]
    fn the_command_table_in_the_docs_names_every_command() {
        let doc = include_str!("../../../docs/commands.md");
        let documented: std::collections::BTreeSet<String> = (doc.lines())
            .filter_map(|l| l.strip_prefix("| `cairn "))
            .map(|rest| {
                let words = rest.split(['`', ' ']).take_while(|w| {
                    !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                });
                words.take(2).collect::<Vec<_>>().join(" ")
            })
            .collect();
        let mut cmd = super::command();
        cmd.build();
        let mut all = Vec::new();
        super::leaves(&cmd, "", &mut all);
        let known: std::collections::BTreeSet<String> = (all.into_iter())
            .filter(|(p, c)| !p.is_empty() && !c.is_hide_set())
            .map(|(p, _)| p)
            .filter(|p| !p.split(' ').any(|w| w == "help"))
            .collect();
        // A documented "cairn mount POOL MNT --salvage" is `mount`; a
        // two-word entry whose second word is no subcommand is its first.
        let documented: std::collections::BTreeSet<String> = (documented.into_iter())
            .map(|d| match known.contains(&d) {
                true => d,
                false => d.split(' ').next().unwrap_or_default().to_string(),
            })
            .collect();
        let undocumented: Vec<_> = known.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&known).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "not in docs/commands.md: {undocumented:?}; documented but unknown: {unknown:?}"
        );
    }

    fn all_ok(missing: &[String]) -> bool {
        missing.is_empty()
    }

    #[test]
    fn man_pages_and_completions_render() {
        let d = tempfile::tempdir().unwrap();
        super::man(d.path()).unwrap();
        assert!(d.path().join("cairn.1").exists());
        assert!(d.path().join("cairn-snapshot-create.1").exists());
        let mut cmd = super::command();
        let mut out = Vec::new();
        clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, "cairn", &mut out);
        assert!(String::from_utf8_lossy(&out).contains("snapshot"));
    }
}
