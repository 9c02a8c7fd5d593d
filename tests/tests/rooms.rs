//! The agent's rooms import downwards only: no cycle among the `crate::`
//! paths of `dpu-agent/src`.
//!
//! A room is a top-level module of the library: `state` is `state.rs`, `dataplane` is
//! `dataplane.rs` with the files under `dataplane/`. Every path in a room's code that
//! names another room is an edge: `use crate::x::…`, `use crate::{x, y::…}`, an inline
//! `crate::x::y(…)`, and `super::`/`self::` paths that lead out of the room. Comments and
//! string literals are not code and do not count; test modules are code and do.
//!
//! `cargo test -p dpu-agent --test rooms -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One code token (comments and literals dropped) and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    line: usize,
}

/// Identifiers, `::` and single punctuation characters of `src`; comments, strings,
/// raw strings, byte strings and char literals are skipped.
fn tokens(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1, &mut line);
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if at(i + 1) == '\\' {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            if matches!(word.as_str(), "r" | "br" | "b" | "c" | "cr") && (at(i) == '"' || at(i) == '#') {
                let mut hashes = 0;
                while at(i + hashes) == '#' {
                    hashes += 1;
                }
                if at(i + hashes) == '"' {
                    if word.contains('r') {
                        i = skip_raw_string(&c, i + hashes + 1, hashes, &mut line);
                    } else {
                        i = skip_string(&c, i + 1, &mut line);
                    }
                    continue;
                }
                if word == "r" && hashes == 1 {
                    i += 1; // a raw identifier: r#type
                    continue;
                }
            }
            if word == "b" && at(i) == '\'' {
                continue; // b'x': the char literal is skipped next round
            }
            out.push(Token { text: word, line });
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Token { text: "::".into(), line });
            i += 2;
        } else {
            out.push(Token { text: ch.to_string(), line });
            i += 1;
        }
    }
    out
}

/// Past the closing quote of a string whose body starts at `i`.
fn skip_string(c: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            ch => {
                *line += usize::from(ch == '\n');
                i += 1;
            }
        }
    }
    i
}

/// Past the closing `"###` of a raw string with `hashes` hashes whose body starts at `i`.
fn skip_raw_string(c: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while i < c.len() {
        if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        *line += usize::from(c[i] == '\n');
        i += 1;
    }
    i
}

/// The rooms a file's code names, with the first line naming each. `module` is the
/// file's module path (`["dataplane", "sessions"]` for `dataplane/sessions.rs`).
fn rooms_named(src: &str, module: &[String]) -> BTreeMap<String, usize> {
    let t = tokens(src);
    let text = |i: usize| t.get(i).map_or("", |t| t.text.as_str());
    let mut named = BTreeMap::new();
    // Inline modules (`mod tests { … }`) open at a brace depth; `super` counts from them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match text(i) {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if text(i + 2) == "{" => inline.push((text(i + 1).to_owned(), depth)),
            _ => {}
        }
        let start =
            matches!(text(i), "crate" | "self" | "super") && text(i + 1) == "::" && text(i.wrapping_sub(1)) != "::";
        if !start {
            i += 1;
            continue;
        }
        let mut path: Vec<String> = match text(i) {
            "crate" => Vec::new(),
            _ => module.iter().cloned().chain(inline.iter().map(|(m, _)| m.clone())).collect(),
        };
        let line = t[i].line;
        let mut j = i;
        while text(j) == "super" && text(j + 1) == "::" {
            path.pop();
            j += 2;
        }
        if text(j) == "crate" || text(j) == "self" {
            j += 2;
        }
        let mut found: Vec<String> = Vec::new();
        match (path.first(), text(j)) {
            (Some(room), _) => found.push(room.clone()),
            (None, "{") => {
                // `crate::{a, b::c, d::{e, f}}`: the first name of each element.
                let mut level = 0;
                let mut k = j;
                loop {
                    match text(k) {
                        "{" => level += 1,
                        "}" => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        "" => break,
                        name if level == 1 && matches!(text(k - 1), "{" | ",") && name != "self" => {
                            found.push(name.to_owned());
                        }
                        _ => {}
                    }
                    k += 1;
                }
            }
            (None, "*") => panic!("line {line}: a glob import of the crate root hides which rooms a file uses"),
            (None, name) => found.push(name.to_owned()),
        }
        for room in found {
            named.entry(room).or_insert(line);
        }
        i = j + 1;
    }
    named
}

/// Every library file under `src` with its module path; the binaries (`main.rs`,
/// `bin/`) are crates of their own.
fn library_files(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(src).unwrap().to_owned();
            if path.is_dir() {
                if rel != Path::new("bin") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || rel == Path::new("main.rs") {
                continue;
            }
            let mut module: Vec<String> =
                rel.with_extension("").iter().map(|part| part.to_string_lossy().into_owned()).collect();
            if module.last().is_some_and(|m| m == "mod" || m == "lib") {
                module.pop();
            }
            files.push((path, module));
        }
    }
    files.sort();
    files
}

/// Room -> rooms it names -> where (file:line) it first does.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn graph(src: &Path) -> Graph {
    let files = library_files(src);
    let rooms: BTreeSet<String> = files.iter().filter_map(|(_, m)| m.first().cloned()).collect();
    let mut g = Graph::new();
    for (path, module) in &files {
        let Some(room) = module.first() else { continue };
        let edges = g.entry(room.clone()).or_default();
        let source = std::fs::read_to_string(path).unwrap();
        for (named, line) in rooms_named(&source, module) {
            if named != *room && rooms.contains(&named) {
                let place = format!("{}:{line}", path.strip_prefix(src).unwrap().display());
                edges.entry(named).or_insert(place);
            }
        }
    }
    g
}

/// A cycle of `g` as rooms, first room repeated at the end, if there is one.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(g: &Graph, room: &str, done: &mut BTreeSet<String>, stack: &mut Vec<String>) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|r| r == room) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(room.to_owned());
            return Some(cycle);
        }
        if done.contains(room) {
            return None;
        }
        stack.push(room.to_owned());
        for next in g.get(room).into_iter().flat_map(|e| e.keys()) {
            if let Some(cycle) = visit(g, next, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(room.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|room| visit(g, room, &mut done, &mut Vec::new()))
}

#[test]
fn rooms_import_downwards_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    for must in ["state", "dataplane", "service", "server", "error"] {
        assert!(
            g.contains_key(must),
            "no room {must} found under {}: is the scan looking in the right place?",
            src.display()
        );
    }
    for (room, edges) in &g {
        println!("{room}: {}", edges.keys().cloned().collect::<Vec<_>>().join(" "));
    }
    if let Some(cycle) = find_cycle(&g) {
        let steps: Vec<String> =
            cycle.windows(2).map(|w| format!("  {} -> {} ({})", w[0], w[1], g[&w[0]][&w[1]])).collect();
        panic!(
            "the rooms of dpu-agent/src import in a loop: {}\n{}\nmove what the lower room needs into it (or below it) \
             so that imports only go downwards",
            cycle.join(" -> "),
            steps.join("\n")
        );
    }
}

#[test]
fn the_scan_sees_paths_in_code_only() {
    let src = r##"
        //! [`crate::doc_link`] in a doc comment
        use crate::{alpha::A, beta, gamma::{self, G}};
        use super::sibling::X;
        /* crate::in_block /* nested crate::deeper */ */
        fn f() -> &'static str {
            let _ = crate::inline::call();
            let _ = 'x';
            let _ = b"crate::bytes";
            let _ = r#"crate::raw "quoted" "#;
            "crate::in_string"
        }
        mod tests {
            use super::*;
            use super::super::super::outer::Y;
        }
    "##;
    let named = rooms_named(src, &["room".to_owned(), "child".to_owned()]);
    let names: Vec<&str> = named.keys().map(String::as_str).collect();
    assert_eq!(names, ["alpha", "beta", "gamma", "inline", "outer", "room"]);
    assert_eq!(named["inline"], 7);
}

#[test]
fn a_loop_is_found_and_a_ladder_is_not() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (a, b) in pairs {
            g.entry(a.to_string()).or_default().insert(b.to_string(), String::new());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    let cycle = find_cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).expect("a loop");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
}
