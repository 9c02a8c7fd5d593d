//! Every crate's modules import downwards only: each crate declares its floors, top to
//! bottom, and no module may name one on its own floor or above.
//!
//! A floor is the set of child modules of one module (the crate root's children are the
//! crate's rooms; `ofi/`'s children are the rooms of `ofi`). A file's code names another
//! module through `crate::…`, `super::…` and `self::…` paths, in `use` declarations or
//! inline, through a name a module re-exports (`super::Worker` where `ofi` says
//! `pub use worker::Worker` names `ofi::worker`), and through glob imports (`use
//! super::*` names whatever it brings in that the file then uses). Each such path is an
//! arrow between the two modules of the floor where their paths part: a file of
//! `ofi/endpoint.rs` naming `crate::ofi::worker::Hold` is the arrow `endpoint ->
//! worker` on the floor of `ofi`, and a file of `ofi` naming `crate::error::Error` is
//! `ofi -> error` on the crate's floor. Comments and literals are not code and do not
//! count; test modules are code and do.
//!
//! What a parent's own file says about its children (`mod`, re-exports, calls) is not
//! an arrow: a module stands above its children. What a child takes from its parent's
//! own items (not re-exported from a sibling) is not one either: those items are the
//! ground the floor stands on.
//!
//! [`FLOORS`] declares the order of every crate's root floor (every library and binary
//! of the workspace with two modules or more), and of nested floors where it helps to
//! say it; an undeclared nested floor must still be free of loops. A failure names each
//! arrow that goes up or sideways, with the file and line that makes it.
//!
//! `cargo test -p dpuio-tests --test rooms -- --nocapture` prints every floor's arrows.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Declared floors, top to bottom: a module may name only modules on floors below its
/// own. Modules on one floor (separated by spaces) know nothing of each other. The key
/// is a crate root file, or the folder of a module's children.
const FLOORS: &[(&str, &[&str])] = &[
    ("proto/src/lib.rs", &["attr host_ring put", "wire", "reason"]),
    ("fabric/src/lib.rs", &["any", "testing", "ucx ofi", "progress", "transport", "config doorbell memory", "error"]),
    ("fabric/src/ofi", &["worker", "endpoint", "shared", "region", "domain"]),
    ("fabric/src/ucx", &["worker", "endpoint", "shared", "region"]),
    (
        "dpu-agent/src/lib.rs",
        &[
            "server deploy",
            "admin service",
            "namespace keys tls",
            "serve_error state",
            "leftovers",
            "persist",
            "dataplane",
            "qos",
            "metrics",
            "runtime",
            "caller config connection validate error",
        ],
    ),
    ("dpu-agent/auth/src/lib.rs", &["pki token qos", "files names"]),
    ("dpu-agent/backend/src/lib.rs", &["local", "rename", "path staged threads"]),
    ("dpu-agent/backend/src/local", &["container", "object", "fsops", "listing dirty"]),
    ("dpu-agent/bench/src/main.rs", &["crypto libdfs"]),
    (
        "dpu-agent/crypto/src/lib.rs",
        &["bench cipher_tests", "cipher", "header", "keys layout", "provider", "vectors error"],
    ),
    ("dpu-agent/daos/src/lib.rs", &["backend", "dir_cache", "retry", "anchor", "dfs", "deadline", "sys", "error"]),
    ("dpu-agent/encryption/src/lib.rs", &["tests", "rotation", "container", "object", "settings", "error"]),
    ("dpu-agent/worker/src/lib.rs", &["direct queue serve", "client", "host link", "control spawn staging", "wire"]),
    ("bench-core/src/lib.rs", &["child", "block unet3d", "figures"]),
    ("host-shim/src/lib.rs", &["posix", "blocking cli put", "client", "dataplane", "error resume"]),
    ("host-shim/src/bin/dpuio/main.rs", &["fuse forward", "inodes"]),
    (
        "host-shim/bench/src/main.rs",
        &[
            "workloads",
            "dlio preload_path qos soak plot startup",
            "report",
            "setup",
            "dfuse_path",
            "libdfs fuse_path tcp_stream",
            "args",
        ],
    ),
    ("host-shim/capi/src/lib.rs", &["batch", "file", "client namespace region", "handles"]),
    ("host-shim/preload/src/lib.rs", &["interpose", "state"]),
    ("host-shim/preload/src/interpose", &["tests", "stdio dirs mmap", "open io stat namespace"]),
    ("host-shim/python/src/lib.rs", &["session", "file", "region", "attr errors"]),
    ("tests/src/lib.rs", &["arm64 daos_server", "daos netns hostile programs"]),
];

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

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// One name a `use` declaration brings in: the path it names (`["super", "worker",
/// "Hold"]`), the name it goes by in the importing module, or a glob (`name` empty).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    path: Vec<String>,
    name: String,
    line: usize,
}

/// Parses the use tree starting at `t[i]` (after `use`) under `prefix`; returns the index
/// after it.
fn use_tree(t: &[Token], mut i: usize, prefix: &[String], out: &mut Vec<Import>) -> usize {
    let text = |i: usize| t.get(i).map_or("", |t| t.text.as_str());
    let mut path = prefix.to_vec();
    while i < t.len() {
        match text(i) {
            "::" => i += 1,
            "{" => {
                i += 1;
                while i < t.len() && text(i) != "}" {
                    i = use_tree(t, i, &path, out);
                    if text(i) == "," {
                        i += 1;
                    }
                }
                return i + 1;
            }
            "*" => {
                out.push(Import { path, name: String::new(), line: t[i].line });
                return i + 1;
            }
            word if is_ident(word) => {
                let line = t[i].line;
                if word != "self" || path.is_empty() || text(i + 1) == "::" {
                    path.push(word.to_owned());
                }
                i += 1;
                if text(i) == "::" {
                    continue;
                }
                let mut name = path.last().cloned().unwrap_or_default();
                if text(i) == "as" {
                    name = text(i + 1).to_owned();
                    i += 2;
                }
                out.push(Import { path, name, line });
                return i;
            }
            _ => return i,
        }
    }
    i
}

/// What one file says: the modules it declares (`mod x;`), the items and imports of its
/// module (outside any inline module or body), and every path in its code with the
/// inline modules it sits in.
#[derive(Debug, Default)]
struct FileScan {
    mods: Vec<String>,
    items: BTreeSet<String>,
    imports: Vec<Import>,
    /// (inline modules around it, the path, its line): uses and inline paths alike.
    paths: Vec<(Vec<String>, Vec<String>, usize)>,
    /// Glob imports anywhere in the file, with the inline modules around them.
    globs: Vec<(Vec<String>, Vec<String>, usize)>,
    /// Every identifier of the file's code, with whether `::` follows it, and its line.
    idents: Vec<(String, bool, usize)>,
}

fn scan(src: &str) -> FileScan {
    let t = tokens(src);
    let text = |i: usize| t.get(i).map_or("", |t: &Token| t.text.as_str());
    let mut s = FileScan::default();
    // Inline modules (`mod tests { … }`) open at a brace depth; `super` counts from them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        let word = text(i);
        if is_ident(word) {
            s.idents.push((word.to_owned(), text(i + 1) == "::", t[i].line));
        }
        let top = inline.is_empty() && depth == 0;
        match word {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if is_ident(text(i + 1)) && text(i + 2) == "{" => inline.push((text(i + 1).to_owned(), depth)),
            "mod" if top && is_ident(text(i + 1)) && text(i + 2) == ";" => s.mods.push(text(i + 1).to_owned()),
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
                if top && is_ident(text(i + 1)) && text(i.wrapping_sub(1)) != "::" =>
            {
                s.items.insert(text(i + 1).to_owned());
            }
            "macro_rules" if top && text(i + 1) == "!" => {
                s.items.insert(text(i + 2).to_owned());
            }
            "use" => {
                let mut found = Vec::new();
                let end = use_tree(&t, i + 1, &[], &mut found);
                let around: Vec<String> = inline.iter().map(|(m, _)| m.clone()).collect();
                for import in found {
                    if import.name.is_empty() {
                        s.globs.push((around.clone(), import.path.clone(), import.line));
                    } else {
                        s.paths.push((around.clone(), import.path.clone(), import.line));
                    }
                    if top {
                        s.imports.push(import);
                    }
                }
                while i < end {
                    let w = text(i);
                    if is_ident(w) {
                        s.idents.push((w.to_owned(), text(i + 1) == "::", t[i].line));
                    }
                    i += 1;
                }
                continue;
            }
            "crate" | "self" | "super" if text(i + 1) == "::" && text(i.wrapping_sub(1)) != "::" => {
                let line = t[i].line;
                let mut path = vec![word.to_owned()];
                let mut j = i + 2;
                while is_ident(text(j)) {
                    path.push(text(j).to_owned());
                    if text(j + 1) != "::" {
                        break;
                    }
                    j += 2;
                }
                let around: Vec<String> = inline.iter().map(|(m, _)| m.clone()).collect();
                s.paths.push((around, path, line));
            }
            _ => {}
        }
        i += 1;
    }
    s
}

/// A module path from the crate root (`["ofi", "worker"]`); the root is empty.
type ModPath = Vec<String>;

/// One library or binary: its module tree and what each module's file says.
struct Crate {
    /// The root file, relative to the workspace (`fabric/src/lib.rs`).
    root: PathBuf,
    files: BTreeMap<ModPath, (PathBuf, FileScan)>,
}

impl Crate {
    fn read(workspace: &Path, root: &Path) -> Crate {
        let mut files = BTreeMap::new();
        let mut todo = vec![(ModPath::new(), root.to_owned())];
        while let Some((module, file)) = todo.pop() {
            let source = std::fs::read_to_string(workspace.join(&file))
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            let s = scan(&source);
            let is_root = module.is_empty() || file.file_name().is_some_and(|n| n == "mod.rs");
            let dir = if is_root { file.parent().unwrap().to_owned() } else { file.with_extension("") };
            for child in &s.mods {
                let flat = dir.join(format!("{child}.rs"));
                let nested = dir.join(child).join("mod.rs");
                let path = if workspace.join(&flat).is_file() { flat } else { nested };
                let mut m = module.clone();
                m.push(child.clone());
                todo.push((m, path));
            }
            files.insert(module, (file, s));
        }
        Crate { root: root.to_owned(), files }
    }

    fn children(&self, module: &[String]) -> Vec<String> {
        self.files.get(module).map(|(_, s)| s.mods.clone()).unwrap_or_default()
    }

    /// The longest prefix of `module` that is a module of the tree (inline modules are
    /// not).
    fn existing<'a>(&self, module: &'a [String]) -> &'a [String] {
        let mut n = module.len();
        while n > 0 && !self.files.contains_key(&module[..n]) {
            n -= 1;
        }
        &module[..n]
    }

    /// Where `name` leads from module `at`: a child module, or the module an import or
    /// glob of `at` takes it from (`at` itself for its own items); `None` if nothing in
    /// this crate.
    fn lookup(&self, at: &[String], name: &str, hops: usize) -> Option<ModPath> {
        self.lookup_through(at, name, hops, &mut Vec::new())
    }

    /// [`Crate::lookup`], not searching again the globs of a module it is already
    /// searching (`searching`): a parent's `pub use child::*` and the child's `use
    /// super::*` would otherwise send the search back and forth.
    fn lookup_through(&self, at: &[String], name: &str, hops: usize, searching: &mut Vec<ModPath>) -> Option<ModPath> {
        let (_, s) = self.files.get(at)?;
        if s.mods.iter().any(|m| m == name) {
            return Some([at, &[name.to_owned()]].concat());
        }
        if s.items.contains(name) {
            return Some(at.to_vec());
        }
        if hops > 16 {
            return None;
        }
        if let Some(import) = s.imports.iter().find(|i| i.name == name) {
            return self.resolve(at, &import.path, hops + 1);
        }
        if searching.iter().any(|m| m == at) {
            return None;
        }
        searching.push(at.to_vec());
        let found = s
            .imports
            .iter()
            .filter(|i| i.name.is_empty())
            .filter_map(|glob| self.resolve(at, &glob.path, hops + 1))
            .find_map(|from| self.lookup_through(&from, name, hops + 1, searching));
        searching.pop();
        found
    }

    /// The module `path` (as written in module `from`, inline modules included) leads
    /// to, or `None` for anything outside this crate.
    fn resolve(&self, from: &[String], path: &[String], hops: usize) -> Option<ModPath> {
        let (mut at, mut k): (ModPath, usize) = match path.first().map(String::as_str) {
            Some("crate") => (Vec::new(), 1),
            Some("self") => (from.to_vec(), 1),
            Some("super") => {
                let mut at = from.to_vec();
                let mut k = 0;
                while path.get(k).is_some_and(|p| p == "super") {
                    at.pop();
                    k += 1;
                }
                (at, k)
            }
            Some(_) => (from.to_vec(), 0),
            None => return None,
        };
        at = self.existing(&at).to_vec();
        if k == 0 {
            // A bare first name: this module's own child or import, else another crate.
            at = self.lookup(&at, &path[0], hops)?;
            k = 1;
        }
        while let Some(name) = path.get(k) {
            match self.lookup(&at, name, hops) {
                Some(next) if next != at => at = next,
                _ => break,
            }
            k += 1;
        }
        Some(at)
    }

    /// Every arrow of the crate: (from module, to module, "file:line").
    fn arrows(&self) -> Vec<(ModPath, ModPath, String)> {
        let mut out = Vec::new();
        for (module, (file, s)) in &self.files {
            let place = |line: usize| format!("{}:{line}", file.display());
            let inside = |around: &[String]| [module.as_slice(), around].concat();
            for (around, path, line) in &s.paths {
                if let Some(to) = self.resolve(&inside(around), path, 0) {
                    out.push((module.clone(), to, place(*line)));
                }
            }
            // A glob brings in names; the file names a module when it uses one of them.
            for (around, path, _) in &s.globs {
                let Some(from) = self.resolve(&inside(around), path, 0) else { continue };
                let children = self.children(&from);
                for (ident, path_follows, line) in &s.idents {
                    if children.contains(ident) && !*path_follows {
                        continue;
                    }
                    if let Some(to) = self.lookup(&from, ident, 0) {
                        out.push((module.clone(), to, place(*line)));
                    }
                }
            }
        }
        out
    }
}

/// Floor (the parent module) -> from -> to -> the first place that makes the arrow.
type Floors = BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>>;

fn floors(krate: &Crate) -> Floors {
    let mut floors = Floors::new();
    for (module, _) in krate.files.iter().filter(|(m, _)| !krate.children(m).is_empty()) {
        let f = floors.entry(module.clone()).or_default();
        for child in krate.children(module) {
            f.entry(child).or_default();
        }
    }
    for (from, to, place) in krate.arrows() {
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        // A parent naming its children, or a child its parent's own items: no arrow.
        if common == from.len() || common == to.len() {
            continue;
        }
        let floor = from[..common].to_vec();
        let edges = floors.entry(floor).or_default().entry(from[common].clone()).or_default();
        edges.entry(to[common].clone()).or_insert(place);
    }
    floors
}

/// A loop among one floor's modules, first module repeated at the end, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeMap<String, String>>,
        room: &str,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
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

/// The key of a floor in [`FLOORS`]: the crate root file for the root floor, else the
/// folder of the module's children.
fn floor_key(krate: &Crate, module: &[String]) -> String {
    if module.is_empty() {
        return krate.root.display().to_string();
    }
    let (file, _) = &krate.files[module];
    let dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
        file.parent().unwrap().to_owned()
    } else {
        file.with_extension("")
    };
    dir.display().to_string()
}

/// What is wrong with one floor, given its arrows and its declared order, if declared.
fn check_floor(key: &str, g: &BTreeMap<String, BTreeMap<String, String>>, declared: Option<&[&str]>) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(order) = declared else {
        if let Some(cycle) = find_cycle(g) {
            let steps: Vec<String> =
                cycle.windows(2).map(|w| format!("    {} -> {} ({})", w[0], w[1], g[&w[0]][&w[1]])).collect();
            problems.push(format!("{key}: the modules import in a loop: {}\n{}", cycle.join(" -> "), steps.join("\n")));
        }
        return problems;
    };
    let mut level = BTreeMap::new();
    for (n, floor) in order.iter().enumerate() {
        for module in floor.split_whitespace() {
            if level.insert(module.to_owned(), n).is_some() {
                problems.push(format!("{key}: {module} is declared on two floors"));
            }
        }
    }
    for module in g.keys().filter(|m| !level.contains_key(*m)) {
        problems.push(format!("{key}: module {module} is on no floor: declare it in FLOORS (tests/tests/rooms.rs)"));
    }
    for module in level.keys().filter(|m| !g.contains_key(*m)) {
        problems.push(format!("{key}: FLOORS names {module}, which is no module here any more: drop it"));
    }
    for (from, edges) in g {
        for (to, place) in edges {
            let (Some(a), Some(b)) = (level.get(from), level.get(to)) else { continue };
            if a >= b {
                let way = if a == b { "sideways, on its own floor" } else { "up" };
                problems.push(format!(
                    "{key}: {from} -> {to} goes {way} ({place}): move what {from} needs from {to} below both, or \
                     move {from} up"
                ));
            }
        }
    }
    problems
}

/// The workspace's members, from its Cargo.toml.
fn members(workspace: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    let list = manifest.split_once("members = [").expect("a members list").1.split_once(']').unwrap().0;
    list.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()).map(PathBuf::from).collect()
}

/// The crate roots of a member: its library, its binary and every `src/bin` binary.
fn roots(workspace: &Path, member: &Path) -> Vec<PathBuf> {
    let src = member.join("src");
    let mut roots: Vec<PathBuf> =
        ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).filter(|p| workspace.join(p).is_file()).collect();
    if let Ok(bins) = std::fs::read_dir(workspace.join(src.join("bin"))) {
        for entry in bins.flatten() {
            let path = entry.path();
            let main = path.join("main.rs");
            let root = if main.is_file() { main } else { path };
            if root.extension().is_some_and(|e| e == "rs") {
                roots.push(root.strip_prefix(workspace).unwrap().to_owned());
            }
        }
    }
    roots.sort();
    roots
}

#[test]
fn every_crate_imports_downwards_only() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let declared: BTreeMap<&str, &[&str]> = FLOORS.iter().copied().collect();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    let mut report = String::new();
    let crates: Vec<PathBuf> = members(workspace).iter().flat_map(|m| roots(workspace, m)).collect();
    assert!(
        crates.iter().any(|r| r.ends_with("dpu-agent/src/lib.rs")),
        "no crates found under {}",
        workspace.display()
    );
    for root in crates {
        let krate = Crate::read(workspace, &root);
        let floors = floors(&krate);
        if !floors.contains_key(&ModPath::new()) || floors[&ModPath::new()].len() < 2 {
            seen.insert(root.display().to_string());
        }
        for (module, g) in &floors {
            let key = floor_key(&krate, module);
            let _ = writeln!(report, "{key}");
            for (from, edges) in g {
                let _ = writeln!(report, "  {from} -> {}", edges.keys().cloned().collect::<Vec<_>>().join(" "));
            }
            let order = declared.get(key.as_str()).copied();
            if module.is_empty() && order.is_none() && g.len() >= 2 {
                problems
                    .push(format!("{key}: a crate with {} modules and no declared floors: add it to FLOORS", g.len()));
            }
            seen.insert(key.clone());
            problems.extend(check_floor(&key, g, order));
        }
    }
    for key in declared.keys().filter(|k| !seen.contains(**k)) {
        problems.push(format!("FLOORS declares {key}, which is no crate root or module folder of the workspace"));
    }
    println!("{report}");
    assert!(problems.is_empty(), "imports that do not go downwards:\n{}", problems.join("\n"));
}

/// The workspace's own crates each member's Cargo.toml depends on (any dependency
/// section), as member folders: a dependency `x.workspace = true` is the member
/// `[workspace.dependencies]` gives a path for.
fn member_dependencies(workspace: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let root = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    let declared = root.split_once("[workspace.dependencies]").expect("[workspace.dependencies]").1;
    let mut paths = BTreeMap::new();
    for line in declared.lines().take_while(|l| !l.starts_with('[')) {
        if let (Some((name, _)), Some((_, rest))) = (line.split_once(" = "), line.split_once("path = \"")) {
            paths.insert(name.trim().to_owned(), rest.split('"').next().unwrap().to_owned());
        }
    }
    let mut deps = BTreeMap::new();
    for member in members(workspace) {
        let manifest = std::fs::read_to_string(workspace.join(&member).join("Cargo.toml")).unwrap();
        let mut section = String::new();
        let mut mine = BTreeSet::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_owned();
            } else if section.ends_with("dependencies]") {
                let name = line.split(['.', ' ', '=']).next().unwrap_or("");
                if let Some(path) = paths.get(name) {
                    mine.insert(path.clone());
                }
            }
        }
        deps.insert(member.display().to_string(), mine);
    }
    deps
}

/// The host side (`host-shim/...`) depends on no crate of the agent (`dpu-agent/...`),
/// directly or through another crate, and `bench-core`, which both benchmark programs
/// share, on neither side: what needs the agent's crates lives on the agent's side.
#[test]
fn the_host_side_depends_on_no_agent_crate() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let deps = member_dependencies(workspace);
    assert!(
        deps.get("host-shim/bench").is_some_and(|d| d.contains("bench-core")),
        "the scan finds no dependencies: {deps:?}"
    );
    let mut problems = Vec::new();
    for (member, direct) in &deps {
        let forbidden = |dep: &str| match member.as_str() {
            "bench-core" => dep.starts_with("dpu-agent") || dep.starts_with("host-shim"),
            m if m.starts_with("host-shim") => dep.starts_with("dpu-agent"),
            _ => false,
        };
        // Every crate it reaches, with the crate it reaches it through.
        let mut reached: BTreeMap<String, String> = direct.iter().map(|d| (d.clone(), member.clone())).collect();
        let mut todo: Vec<String> = direct.iter().cloned().collect();
        while let Some(dep) = todo.pop() {
            for next in deps.get(&dep).into_iter().flatten() {
                if !reached.contains_key(next) {
                    reached.insert(next.clone(), dep.clone());
                    todo.push(next.clone());
                }
            }
        }
        for (dep, through) in reached.iter().filter(|(d, _)| forbidden(d)) {
            problems.push(format!(
                "{member} depends on {dep} (through {through}/Cargo.toml): move what needs it to the agent's side \
                 (as dpu-agent/bench does for the benchmarks)"
            ));
        }
    }
    assert!(problems.is_empty(), "crates that cross from the host side into the agent's:\n{}", problems.join("\n"));
}

#[test]
fn the_scan_sees_paths_in_code_only() {
    let src = r##"
        //! [`crate::doc_link`] in a doc comment
        use crate::{alpha::A, beta, gamma::{self, G}};
        use super::sibling::X as Y;
        mod child;
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
            use super::super::super::outer::Z;
        }
    "##;
    let s = scan(src);
    assert_eq!(s.mods, ["child"]);
    assert!(s.items.contains("f") && !s.items.contains("tests"));
    let paths: Vec<String> =
        s.paths.iter().map(|(around, p, _)| format!("{}|{}", around.join("/"), p.join("::"))).collect();
    assert_eq!(
        paths,
        [
            "|crate::alpha::A",
            "|crate::beta",
            "|crate::gamma",
            "|crate::gamma::G",
            "|super::sibling::X",
            "|crate::inline::call",
            "tests|super::super::super::outer::Z",
        ]
    );
    let imported: Vec<&str> = s.imports.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(imported, ["A", "beta", "gamma", "G", "Y"]);
    assert_eq!(s.globs.len(), 1);
    assert_eq!(s.paths[5].2, 8);
}

/// A crate made of the given files (module path, source), to test the arrows.
fn crate_of(files: &[(&str, &str)]) -> Crate {
    let mut map = BTreeMap::new();
    for (module, source) in files {
        let path: ModPath = module.split('/').filter(|p| !p.is_empty()).map(str::to_owned).collect();
        let file =
            if path.is_empty() { PathBuf::from("src/lib.rs") } else { PathBuf::from(format!("src/{module}.rs")) };
        map.insert(path, (file, scan(source)));
    }
    Crate { root: PathBuf::from("src/lib.rs"), files: map }
}

#[test]
fn arrows_follow_re_exports_and_globs_and_part_where_paths_part() {
    let krate = crate_of(&[
        ("", "mod error; mod net; pub use error::Error;"),
        ("error", "pub struct Error;"),
        ("net", "mod worker; mod endpoint; mod domain; pub use worker::Worker; fn helper() {}"),
        ("net/worker", "use super::domain::Domain; use crate::Error; pub struct Worker; fn f() { super::helper(); }"),
        ("net/endpoint", "use super::*; fn g(w: &Worker) {} mod tests { use super::*; }"),
        ("net/domain", "pub struct Domain;"),
    ]);
    let floors = floors(&krate);
    let arrows = |floor: &[&str]| -> Vec<String> {
        let key: ModPath = floor.iter().map(|s| s.to_string()).collect();
        floors[&key].iter().flat_map(|(from, to)| to.keys().map(move |t| format!("{from}->{t}"))).collect()
    };
    assert_eq!(arrows(&[]), ["net->error"]);
    assert_eq!(arrows(&["net"]), ["endpoint->worker", "worker->domain"]);
    let g = &floors[&vec!["net".to_owned()]];
    assert!(check_floor("net", g, Some(&["endpoint", "worker", "domain"])).is_empty());
    let wrong = check_floor("net", g, Some(&["worker domain", "endpoint"]));
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(wrong[0].contains("endpoint -> worker goes up (src/net/endpoint.rs:1)"), "{wrong:?}");
    assert!(wrong[1].contains("worker -> domain goes sideways"), "{wrong:?}");
}

#[test]
fn a_loop_is_found_and_a_ladder_is_not() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
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
    assert_eq!(check_floor("x", &edges(&[("a", "b"), ("b", "a")]), None).len(), 1);
}

#[test]
fn a_parent_re_exporting_children_that_glob_it_is_searched_once() {
    // capi's shape: the root re-exports each family (`pub use a::*`) and each family
    // takes the root's helpers (`use super::*`); a name one family takes from another
    // through the root is an arrow between the two, found without going round forever.
    let krate = crate_of(&[
        ("", "mod a; mod b; mod c; pub use a::*; pub use b::*; pub use c::*; fn helper() {}"),
        ("a", "use super::*; pub fn fa() { fb(); helper(); missing(); }"),
        ("b", "use super::*; pub fn fb() {}"),
        ("c", "use super::*; pub fn fc() {}"),
    ]);
    let floors = floors(&krate);
    let g = &floors[&ModPath::new()];
    let arrows: Vec<String> = g.iter().flat_map(|(from, to)| to.keys().map(move |t| format!("{from}->{t}"))).collect();
    assert_eq!(arrows, ["a->b"]);
}
