//! The manual holds together: the README stays a front page, the book's table of contents names
//! every chapter exactly once, and every relative link in the README and the book resolves: to a
//! file that exists and, with a `#fragment`, to a heading of that file (the slug GitHub and mdBook
//! both make: lower case, spaces to `-`, punctuation other than `-` and `_` dropped).
//! No services; reads files only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The slugs of a Markdown file's headings, outside fenced code.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced && line.starts_with('#') {
            let heading = line.trim_start_matches('#');
            if heading.starts_with(' ') {
                out.insert(slug(heading));
            }
        }
    }
    out
}

/// `](target)` link targets outside fenced and inline code, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code spans so that `a](b)` inside backticks is not read as a link.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root().join("docs/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    chapters.sort();
    files.extend(chapters);
    files
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn every_relative_link_resolves_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            // Images are files too: read as bytes.
            let Ok(dest_text) = std::fs::read(&dest).map(|b| String::from_utf8_lossy(&b).into_owned()).or_else(|e| {
                if dest.is_dir() {
                    Ok(String::new())
                } else {
                    Err(e)
                }
            }) else {
                broken.push(format!("{}:{line}: {target}: no such file", rel(&file)));
                continue;
            };
            if let Some(f) = fragment {
                if !anchors(&dest_text).contains(f) {
                    broken.push(format!("{}:{line}: {target}: no heading #{f} in {}", rel(&file), rel(&dest)));
                }
            }
        }
    }
    assert!(checked >= 40, "the link scan found only {checked} relative links; is it still reading the files?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_table_of_contents_names_every_chapter_once() {
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    let listed: Vec<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    let unique: BTreeSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "a chapter is listed twice in SUMMARY.md: {listed:?}");
    for file in markdown_files().into_iter().skip(1) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if name != "SUMMARY.md" {
            assert!(listed.contains(&name), "docs/src/{name} is not in docs/src/SUMMARY.md");
        }
    }
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; move detail into a chapter of docs/src");
    for needle in ["scripts/test", "scripts/demo", "docs/src/flags.md"] {
        assert!(readme.contains(needle), "README.md no longer mentions {needle}");
    }
}

#[test]
fn the_link_scanner_sees_links_and_headings() {
    let text = "# A title, with `code`!\n## Sub_part-2\n[x](a.md#a-title-with-code) `[y](no)`\n```\n[z](no)\n```\n";
    assert_eq!(links(text), vec![(3, "a.md#a-title-with-code".to_owned())]);
    assert_eq!(anchors(text), BTreeSet::from(["a-title-with-code".to_owned(), "sub_part-2".to_owned()]));
}

/// The flag reference of every subcommand, from clap's own definitions: what `--help` says.
fn flag_reference() -> String {
    use clap::CommandFactory;
    let mut out = String::from(
        "# Flag reference\n\n\
         Generated from the code: every subcommand's flags as clap defines them, so it cannot drift \
         from `--help`. `tests/docs.rs` fails when this file differs from what the code says; \
         `OUTBOXD_BLESS=1 cargo test --test docs` rewrites it. The explained tables (with Debezium's \
         names beside ours) are in [Flags of `outboxd run`](flags.md). The same definitions render the \
         man pages in `docs/man/` (`man -l docs/man/outboxd-run.1`; install them under \
         `/usr/share/man/man1`).\n",
    );
    fn walk(cmd: &clap::Command, path: &str, out: &mut String) {
        let name = if path.is_empty() { cmd.get_name().to_owned() } else { format!("{path} {}", cmd.get_name()) };
        let args: Vec<&clap::Arg> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
            .collect();
        if !path.is_empty() {
            out.push_str(&format!("\n## `{name}`\n\n"));
            if let Some(about) = cmd.get_about() {
                out.push_str(&format!("{}\n\n", cell(&about.to_string())));
            }
            if args.is_empty() {
                out.push_str("No flags.\n");
            } else {
                out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
                for a in args {
                    let flag = match (a.get_long(), a.get_short()) {
                        (Some(l), Some(s)) => format!("`-{s}`, `--{l}`"),
                        (Some(l), None) => format!("`--{l}`"),
                        (None, Some(s)) => format!("`-{s}`"),
                        (None, None) => format!("`{}` (argument)", a.get_id().as_str().to_uppercase()),
                    };
                    let env = a.get_env().map_or(String::new(), |e| format!("`{}`", e.to_string_lossy()));
                    let defaults: Vec<String> =
                        a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
                    let default = if defaults.is_empty() { String::new() } else { format!("`{}`", defaults.join(",")) };
                    let mut help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                    let values: Vec<String> = a
                        .get_possible_values()
                        .iter()
                        .filter(|v| !v.is_hide_set())
                        .map(|v| format!("`{}`", v.get_name()))
                        .collect();
                    if !values.is_empty()
                        && a.get_action().takes_values()
                        && !matches!(values.as_slice(), [t, f] if t == "`true`" && f == "`false`")
                    {
                        if !help.is_empty() && !help.ends_with('.') {
                            help.push('.');
                        }
                        help.push_str(&format!(" One of: {}.", values.join(", ")));
                    }
                    out.push_str(&format!("| {flag} | {env} | {} | {} |\n", cell(&default), cell(&help)));
                }
            }
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            walk(sub, &name, out);
        }
    }
    /// One table cell: one line, pipes escaped.
    fn cell(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
    }
    walk(&outboxd::config::Cli::command(), "", &mut out);
    out
}

#[test]
fn the_flag_reference_is_what_the_code_says() {
    let file = root().join("docs/src/reference.md");
    let want = flag_reference();
    if std::env::var_os("OUTBOXD_BLESS").is_some() {
        std::fs::write(&file, &want).unwrap();
    }
    let have = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        have == want,
        "docs/src/reference.md differs from the flags in the code; run OUTBOXD_BLESS=1 cargo test --test docs and commit it"
    );
    assert!(want.contains("## `outboxd run`") && want.contains("`--postgres-url`"), "the walk found no run flags");
}

/// The man pages (`docs/man/outboxd.1` and one per subcommand, `outboxd-run.1`, ...), rendered from
/// the same clap definitions as the flag reference, so they cannot drift either.
fn man_pages() -> Vec<(String, Vec<u8>)> {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, prefix: &str, out: &mut Vec<(String, Vec<u8>)>) {
        let name = if prefix.is_empty() { cmd.get_name().to_owned() } else { format!("{prefix}-{}", cmd.get_name()) };
        let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
        let cmd = cmd.clone().name(leaked);
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut page).expect("render a man page");
        out.push((format!("{name}.1"), page));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            walk(sub, &name, out);
        }
    }
    let mut out = Vec::new();
    let mut cli = outboxd::config::Cli::command();
    cli.build();
    walk(&cli, "", &mut out);
    out
}

#[test]
fn the_man_pages_are_what_the_code_says() {
    let dir = root().join("docs/man");
    let want = man_pages();
    if std::env::var_os("OUTBOXD_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, page) in &want {
            std::fs::write(dir.join(name), page).unwrap();
        }
    }
    let mut have: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    have.sort();
    let mut names: Vec<String> = want.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    let stale = "differs from the flags in the code; run OUTBOXD_BLESS=1 cargo test --test docs and commit docs/man";
    assert_eq!(have, names, "docs/man {stale}");
    for (name, page) in &want {
        let on_disk = std::fs::read(dir.join(name)).unwrap_or_default();
        assert!(&on_disk == page, "docs/man/{name} {stale}");
    }
    assert!(names.contains(&"outboxd-run.1".to_owned()), "no page for outboxd run: {names:?}");
    let run = String::from_utf8_lossy(&want.iter().find(|(n, _)| n == "outboxd-run.1").unwrap().1).into_owned();
    assert!(run.contains("postgres\\-url"), "the run page lists no --postgres-url");
}
