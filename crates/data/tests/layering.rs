//! The data crate's modules form layers with no import cycle: each file in
//! `src/` may refer only to modules listed before it in `ORDER` (bottom to
//! top). A reference is a `crate::name` path (also each head of a
//! `use crate::{a, b::c}` group), a `super::` path that climbs out of its
//! file to the crate root, or a name lib.rs re-exports (`crate::ChunkStore`
//! refers to `store`). Comments and string literals are skipped; test
//! modules (`#[cfg(test)]`) are checked like the rest of the file.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

/// The layers, bottom to top (keep in step with the comment in lib.rs).
const ORDER: &[&str] = &[
    "compress",
    "error",
    "ec",
    "deadline",
    "aligned",
    "chunk",
    "codec",
    "layout",
    "records",
    "stripe_rec",
    "stripes",
    "policy",
    "heat",
    "cache",
    "wpipe",
    "copies",
    "dead_pages",
    "open_segment",
    "segments",
    "writer",
    "readahead",
    "store",
    "stripe_read",
    "span_read",
    "read",
    "heal",
    "verified",
    "relocate",
    "stripe_parity",
    "stripe_build",
];

fn src_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module file of src/ but lib.rs: name -> code without comments
/// and literals.
fn modules() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(src_dir()).expect("read src/") {
        let path = entry.expect("dir entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            let text = std::fs::read_to_string(&path).expect("read module");
            out.insert(name, strip(&text));
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The code with comments removed and string and char literals emptied.
fn strip(src: &str) -> String {
    let s: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        i = match (s[i], s.get(i + 1).copied()) {
            ('/', Some('/')) => skip_line(&s, i),
            ('/', Some('*')) => skip_block_comment(&s, i),
            ('"', _) => skip_string(&s, i, &mut out),
            ('r', Some('"' | '#')) if i == 0 || !is_ident(s[i - 1]) => skip_raw(&s, i, &mut out),
            ('\'', _) => skip_char(&s, i, &mut out),
            (c, _) => {
                out.push(c);
                i + 1
            }
        };
    }
    out
}

fn skip_line(s: &[char], i: usize) -> usize {
    s[i..]
        .iter()
        .position(|&c| c == '\n')
        .map_or(s.len(), |n| i + n)
}

fn skip_block_comment(s: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < s.len() {
        match (s[i], s.get(i + 1).copied()) {
            ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
            ('*', Some('/')) => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
        if depth == 0 {
            return i;
        }
    }
    i
}

fn skip_string(s: &[char], mut i: usize, out: &mut String) -> usize {
    out.push_str("\"\"");
    i += 1;
    while i < s.len() && s[i] != '"' {
        i += if s[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// `r"..."` or `r#"..."#` (any number of #); a plain `r#ident` is kept.
fn skip_raw(s: &[char], i: usize, out: &mut String) -> usize {
    let hashes = s[i + 1..].iter().take_while(|&&c| c == '#').count();
    if s.get(i + 1 + hashes) != Some(&'"') {
        out.push('r');
        return i + 1;
    }
    let close: String = std::iter::once('"')
        .chain("#".repeat(hashes).chars())
        .collect();
    let body: String = s[i + 2 + hashes..].iter().collect();
    out.push_str("\"\"");
    body.find(&close).map_or(s.len(), |n| {
        i + 2 + hashes + body[..n].chars().count() + close.len()
    })
}

/// A char literal (`'x'`, `'\n'`, `'\u{7b}'`) is emptied; a lifetime is kept.
fn skip_char(s: &[char], i: usize, out: &mut String) -> usize {
    let end = match s.get(i + 1) {
        Some('\\') => s[i + 2..]
            .iter()
            .position(|&c| c == '\'')
            .map(|n| i + 2 + n),
        Some(_) if s.get(i + 2) == Some(&'\'') => Some(i + 2),
        _ => None,
    };
    match end {
        Some(e) => {
            out.push_str("' '");
            e + 1
        }
        None => {
            out.push('\'');
            i + 1
        }
    }
}

/// The leading identifier of `s` (after whitespace).
fn ident_at(s: &str) -> &str {
    let s = s.trim_start();
    &s[..s.find(|c: char| !is_ident(c)).unwrap_or(s.len())]
}

/// The heads of the items of a `{...}` group at the start of `s`.
fn group_heads(s: &str) -> Vec<String> {
    let (mut depth, mut start, mut heads) = (0, 1, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                heads.push(ident_at(&s[start..i]).to_string());
                start = i + 1;
            }
            _ => {}
        }
        if c == '}' {
            depth -= 1;
            if depth == 0 {
                break;
            }
        }
    }
    heads.retain(|h| !h.is_empty() && h != "self");
    heads
}

/// Names at the crate root that `code` refers to: `crate::` paths and
/// `super::` paths that climb past the file's inline modules.
fn root_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut mods: Vec<bool> = Vec::new(); // open braces: does each open a `mod`?
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let fresh = !code[..i].ends_with(is_ident);
        if fresh && rest.starts_with("crate::") {
            refs.extend(path_heads(&rest[7..]));
        } else if fresh && rest.starts_with("super::") {
            let inline = mods.iter().filter(|&&m| m).count();
            refs.extend(super_ref(rest, inline));
        } else if rest.starts_with('{') {
            mods.push(opens_mod(&code[..i]));
        } else if rest.starts_with('}') {
            mods.pop();
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    refs
}

/// The heads of what follows `crate::`: one name, or a group's names.
fn path_heads(after: &str) -> Vec<String> {
    let after = after.trim_start();
    if after.starts_with('{') {
        return group_heads(after);
    }
    vec![ident_at(after).to_string()]
}

/// The root name a `super::super::...name` path at `s` reaches, if its
/// supers climb out of the `inline` modules it is nested in.
fn super_ref(s: &str, inline: usize) -> Vec<String> {
    let mut rest = s;
    let mut n = 0;
    while let Some(r) = rest.trim_start().strip_prefix("super::") {
        rest = r;
        n += 1;
    }
    match n == inline + 1 {
        true => path_heads(rest),
        false => Vec::new(),
    }
}

/// True if the `{` after `before` opens a `mod name` block.
fn opens_mod(before: &str) -> bool {
    let t = before.trim_end();
    let name_len = t.chars().rev().take_while(|&c| is_ident(c)).count();
    let t = t[..t.len() - name_len].trim_end();
    name_len > 0 && t.ends_with("mod") && !t[..t.len() - 3].ends_with(is_ident)
}

/// lib.rs `pub use module::{A, B}` / `pub use module::A`: name -> module.
fn reexports() -> HashMap<String, String> {
    let lib = strip(&std::fs::read_to_string(src_dir().join("lib.rs")).expect("read lib.rs"));
    let mut out = HashMap::new();
    for stmt in lib.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = ident_at(path).to_string();
        let after = path[module.len()..].trim_start().trim_start_matches("::");
        for name in path_heads(after) {
            out.insert(name, module.clone());
        }
    }
    out
}

/// Every reference from one module to another: (from, to, the name used);
/// a name that is neither a module nor a re-export gets to = "?".
fn edges() -> BTreeSet<(String, String, String)> {
    let mods = modules();
    let re = reexports();
    let mut out = BTreeSet::new();
    for (from, code) in &mods {
        for name in root_refs(code) {
            let to = match (mods.contains_key(&name), re.get(&name)) {
                (true, _) => name.clone(),
                (false, Some(m)) => m.clone(),
                (false, None) => "?".to_string(),
            };
            if &to != from {
                out.insert((from.clone(), to, name));
            }
        }
    }
    out
}

fn rank(module: &str) -> Option<usize> {
    ORDER.iter().position(|m| *m == module)
}

#[test]
fn every_module_refers_only_to_layers_below_it() {
    let bad: Vec<String> = edges()
        .into_iter()
        .filter(|(from, to, _)| match (rank(from), rank(to)) {
            (Some(f), Some(t)) => t >= f,
            _ => true,
        })
        .map(|(from, to, name)| format!("{from}.rs -> {to} (crate::{name})"))
        .collect();
    assert!(
        bad.is_empty(),
        "references not to a layer below (order, bottom to top: {ORDER:?}):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn layer_order_lists_every_module_once() {
    let files: BTreeSet<String> = modules().into_keys().collect();
    let listed: BTreeSet<String> = ORDER.iter().map(|m| m.to_string()).collect();
    assert_eq!(listed.len(), ORDER.len(), "a module listed twice");
    assert_eq!(files, listed, "src/*.rs files vs ORDER");
}

#[test]
fn finds_paths_in_groups_nested_modules_and_past_comments() {
    let code = strip(
        r#"
        use crate::a::X;
        use crate::{b, c::{D, E}, self};
        // use crate::commented;
        /* crate::blocked */
        let s = "crate::quoted {";
        let c = '{';
        fn f<'a>(x: &'a str) { crate::f::g(); }
        use super::h::Y;
        mod tests {
            use super::*;
            use super::super::i;
            use crate::Z;
        }
        "#,
    );
    let got: Vec<String> = root_refs(&code).into_iter().collect();
    assert_eq!(got, ["Z", "a", "b", "c", "f", "h", "i"]);
}
