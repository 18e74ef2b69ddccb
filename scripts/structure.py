#!/usr/bin/env python3
"""Code-structure report of src/: sizes, the file-level import graph, circles and arrows against
the intended layering, as Markdown (or JSON), for before/after comparisons of a refactoring.

Usage: python3 scripts/structure.py [--root DIR] [--json]   (DIR defaults to this script's repo)

Measures: .rs files and lines (as `wc -l`) per folder, the 15 largest files; the graph "file A
depends on file B" (code in A names a path that resolves into B); its strongly connected components
and two-file circles, also between top-level modules (src/x.rs and src/x/ are `x`); edges from a
lower layer of LAYERS into a higher one, and the CHECKS below, each with the first line making it
(a `use` line when there is one).

How paths are resolved, from the code's own `mod`, `use` and paths (nothing is compiled):
  * Comments, strings and char literals are blanked first (offsets kept): doc links such as
    [`super::timestamp`] and text in strings do not count.
  * The module tree is built as rustc does, from src/lib.rs (and src/main.rs, a second crate),
    along `mod x;` to x.rs or x/mod.rs (beside lib.rs/main.rs/mod.rs, else in the folder named
    after the file: config/debezium.rs -> config/debezium/), honouring #[path]. An inline
    `mod x {..}` is a module of its file. `mod x;` itself makes no edge.
  * Every `use` (pub, multi-line, nested braces, self, *, `as`, in fn bodies too) is expanded into
    full paths; so is every other path starting with crate::, self::, super:: or a child module of
    the current module (`crate::pipeline::backoff(..)`, `super::kafka_events::spawn`). In
    src/main.rs the library's name (`outboxd::`) stands for crate::.
  * A path goes to the file of the deepest module it names (`crate::pipeline::route_masked` ->
    src/source/wal/mod.rs); if the next name is a `pub use` re-export there (`crate::sink::KafkaSink`)
    it is followed to the defining file (sink/kafka/mod.rs). The facade's `pub use` is its own edge.
  * Tests: the item after each #[cfg(test)] / #[cfg(all(test, ..))] (inline `mod tests {..}`, fn,
    `use`, or `mod tests;`, whose file and sub-files become test-only) is found by brace matching;
    paths in it make no edge. Test-only files still count in the sizes.
Not seen: paths made by macros (macro_rules bodies count as plain code), names reached through a
glob (`use super::*` is one edge to the parent's file), glob re-exports, #[path] inside inline
modules, cfgs other than test (feature- or platform-gated code counts).
"""
import argparse
import bisect
import json
import re
import tomllib
from collections import defaultdict
from pathlib import Path

# ---------------------------------------------------------------------------------------------------
# Intended layering, low to high. A module is named by its path without `crate::` ("<lib>" is
# src/lib.rs, "<main>" src/main.rs); a file takes the layer of the longest entry that prefixes its
# module path. Edges within a layer are fine; an edge from a lower layer into a higher one is a
# back-up arrow.
LAYERS = [
    ("base", ["error", "lsn", "task", "retry", "metrics", "health"]),   # no domain knowledge
    ("config", ["config"]),                                     # flags, files, validation: no runtime
    ("core", ["router", "pg"]),                                 # rows -> records, PostgreSQL clients
    ("delivery", ["sink"]),                                     # sinks and the handle they resolve
    ("engine", ["relay"]),                                      # the one loop body every source feeds; dead letters
    ("sources", ["source"]),                                    # WAL session (and its tracker), polling, backfill
    ("tools", ["tools", "router::mask::decrypt"]),
                                                                # subcommands other than run/poll/backfill
    ("app", ["app"]),                                           # the supervisor of `run`
    ("entry", ["<lib>", "<main>"]),                             # crate root, binary
]
# Hot path: code every relayed event goes through. "!x" excludes x from a longer prefix above it.
HOT_PATH = ["source", "relay", "sink", "router", "!router::mask::decrypt",
            "pg::replication", "pg::pgoutput"]
# Specific checks: (title, importer prefixes, imported prefixes).
CHECKS = [
    ("config/ importing runtime modules", ["config"],
     ["sink", "source", "relay", "pg::replication", "dlq", "app"]),
    ("sinks importing a source or the engine", ["sink"], ["source", "relay"]),
    ("one source importing another", ["source::poll", "source::backfill"], ["source::wal"]),
    ("hot-path code importing dlq", HOT_PATH, ["dlq"]),
]
# ---------------------------------------------------------------------------------------------------

TOKEN = re.compile(r'//|/\*|b?r#*"|"|\'')
CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]+\}|.)|[^\\'\n])'")
MOD = re.compile(r'(?<![\w$])mod\s+(?:r#)?([A-Za-z_]\w*)\s*([;{])')
USE = re.compile(r'(?<![\w$])(?:(pub)\s*(?:\([^)]*\))?\s*)?use\s+')
PATH = re.compile(r'(?<![\w:$#])([A-Za-z_]\w*)((?:\s*::\s*(?:[A-Za-z_]\w*|\*))+)')
PATH_ATTR = re.compile(r'#\[\s*path\s*=(\s*)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s*(?:\([^)]*\))?\s*)?$')
CFG_TEST = re.compile(r'#\[\s*cfg\s*\(\s*(?:test|all\s*\(\s*test\b[^\]]*\))\s*\)\s*\]')

def blank_noncode(src):
    """Comments, strings and char literals replaced by spaces (newlines kept): same offsets."""
    out, i, n = list(src), 0, len(src)
    while (m := TOKEN.search(src, i)):
        s, tok = m.start(), m.group()
        if tok == "//":
            e = src.find("\n", s); e = n if e < 0 else e
        elif tok == "/*":                                  # block comments nest in Rust
            depth, e = 1, s + 2
            while e < n and depth:
                step = src[e:e + 2]
                depth += (step == "/*") - (step == "*/")
                e += 2 if step in ("/*", "*/") else 1
        elif tok == "'":
            c = CHAR.match(src, s)
            e = c.end() if c else s + 1                    # no match: a lifetime
        elif tok.endswith('"') and "r" in tok and not (s and (src[s - 1].isalnum() or src[s - 1] == "_")):
            hashes = tok[tok.index("r") + 1:-1]            # raw string r#"..."#
            e = src.find('"' + hashes, m.end()); e = n if e < 0 else e + 1 + len(hashes)
        else:                                              # "..." or b"..."
            s = m.end() - 1; e = s + 1
            while e < n and src[e] != '"':
                e += 2 if src[e] == "\\" else 1
            e += 1
        e = min(e, n)
        out[s:e] = [c if c == "\n" else " " for c in src[s:e]]
        i = max(e, s + 1)
    return "".join(out)

def close_brace(clean, k):
    """Offset of the `}` matching the `{` at k."""
    depth = 0
    for j in range(k, len(clean)):
        depth += (clean[j] == "{") - (clean[j] == "}")
        if depth == 0:
            return j
    return len(clean) - 1

def test_ranges(clean):
    """(start, end) of every item guarded by #[cfg(test)]."""
    ranges = []
    for m in CFG_TEST.finditer(clean):
        p = m.end()
        while (a := re.match(r'\s*#\[', clean[p:p + 200])):   # further attributes
            p = clean.index("]", p + a.end()) + 1
        depth, end = 0, len(clean)
        for k in range(p, len(clean)):
            ch = clean[k]
            if ch in "([": depth += 1
            elif ch in ")]": depth -= 1
            elif ch == ";" and depth == 0: end = k + 1; break
            elif ch == "{" and depth == 0: end = close_brace(clean, k) + 1; break
        ranges.append((m.start(), end))
    return ranges

class Source:
    """One .rs file: text, module path, inline modules and test ranges."""
    def __init__(self, path, rel, crate, modpath, test):
        self.rel, self.crate, self.modpath = rel, crate, modpath
        self.orig = path.read_text(encoding="utf-8")
        self.clean = blank_noncode(self.orig)
        self.nl = [i for i, c in enumerate(self.orig) if c == "\n"]
        self.tests = test_ranges(self.clean)
        self.test = test or bool(re.match(r'(?:\s|#!\[[^\]]*\])*#!\[\s*cfg\s*\(\s*test\s*\)', self.clean))
        self.inline = [(m.start(), close_brace(self.clean, m.end() - 1), m.group(1))
                       for m in MOD.finditer(self.clean) if m.group(2) == "{"]

    def line(self, off):
        return bisect.bisect_left(self.nl, off) + 1

    def in_test(self, off):
        return self.test or any(a <= off < b for a, b in self.tests)

    def module_at(self, off):
        return self.modpath + tuple(n for a, b, n in sorted(self.inline) if a < off < b)

class Project:
    def __init__(self, root):
        self.root, self.src = root, root / "src"
        cargo = tomllib.loads((root / "Cargo.toml").read_text())
        self.libname = cargo.get("lib", {}).get("name", cargo["package"]["name"]).replace("-", "_")
        self.files, self.modules, self.children = {}, {}, defaultdict(set)
        self.reexports = defaultdict(dict)     # (crate, module) -> {name: (crate, absolute path)}
        self.edges = defaultdict(list)         # (from rel, to rel) -> [(is_use, line, text, test)]
        for crate, name in (("lib", "lib.rs"), ("bin", "main.rs")):
            if (self.src / name).exists():
                self.load(self.src / name, crate, (), False)
        self.uses = {rel: self.parse_uses(f) for rel, f in self.files.items()}
        for f in self.files.values():
            self.scan(f)

    def load(self, path, crate, modpath, test):
        rel = path.relative_to(self.root).as_posix()
        f = self.files[rel] = Source(path, rel, crate, modpath, test)
        self.modules[(crate, modpath)] = rel
        for a, b, name in f.inline:
            self.modules[(crate, f.module_at(a) + (name,))] = rel
            self.children[(crate, f.module_at(a))].add(name)
        base = path.parent if path.name in ("lib.rs", "main.rs", "mod.rs") else path.with_suffix("")
        for m in MOD.finditer(f.clean):
            if m.group(2) != ";":
                continue
            mod, name, w = f.module_at(m.start()), m.group(1), max(0, m.start() - 300)
            given = PATH_ATTR.search(f.clean, w, m.start())     # #[path = "x.rs"] (string blanked)
            inner = mod[len(modpath):]
            cands = [path.parent / f.orig[given.start(1):given.end(1)].strip().strip('"')] if given else \
                [base.joinpath(*inner, name + ".rs"), base.joinpath(*inner, name, "mod.rs")]
            self.children[(crate, mod)].add(name)
            for c in cands:
                if c.exists():
                    self.load(c, crate, mod + (name,), f.in_test(m.start()))
                    break

    def absolute(self, crate, cur, segs):
        """(crate, absolute module path) of a path as written in module cur, or None (extern/local)."""
        head = segs[0]
        if head == "crate":
            return crate, tuple(segs[1:])
        if head == self.libname and crate == "bin":
            return "lib", tuple(segs[1:])
        if head in ("self", "super"):
            rest = list(segs[1:] if head == "self" else segs)
            while rest and rest[0] == "super":
                cur, rest = cur[:-1], rest[1:]
            return crate, cur + tuple(rest)
        if head in self.children[(crate, cur)]:
            return crate, cur + tuple(segs)
        return None

    def target(self, crate, full, depth=0):
        """File of the deepest module of full, following `pub use` re-exports of the next name."""
        k = len(full)
        while (crate, full[:k]) not in self.modules:
            k -= 1
        item = full[k:]
        if item and depth < 8 and (re_ := self.reexports[(crate, full[:k])].get(item[0])):
            return self.target(re_[0], re_[1] + item[1:], depth + 1)
        return self.modules[(crate, full[:k])]

    def parse_uses(self, f):
        """Every `use` statement: (start, end, pub, [(path segments, alias)]); registers re-exports."""
        out = []
        for m in USE.finditer(f.clean):
            end = f.clean.find(";", m.end())
            if end < 0:                                  # not a use statement (macro text?)
                continue
            toks = re.findall(r'::|[{},*]|\w+', f.clean[m.end():end])
            leaves = []
            tree(toks, 0, [], leaves)
            out.append((m.start(), end, bool(m.group(1)), leaves))
            cur = f.module_at(m.start())
            for segs, alias in leaves if m.group(1) and not f.in_test(m.start()) else []:
                if segs and alias != "*" and (a := self.absolute(f.crate, cur, segs)):
                    self.reexports[(f.crate, cur)][alias] = a
        return out

    def add(self, f, off, segs, is_use, text):
        cur = f.module_at(off)
        if not segs or not (a := self.absolute(f.crate, cur, segs)):
            return
        rel = self.target(*a)
        if rel != f.rel:
            self.edges[(f.rel, rel)].append((is_use, f.line(off), " ".join(text.split())[:150], f.in_test(off)))

    def scan(self, f):
        spans = []
        for start, end, _, leaves in self.uses[f.rel]:
            spans.append((start, end))
            for segs, _ in leaves:
                self.add(f, start, segs, True, f.clean[start:end + 1])
        for m in PATH.finditer(f.clean):
            if any(a <= m.start() < b for a, b in spans):
                continue
            segs = [m.group(1)] + re.findall(r'\w+|\*', m.group(2))
            text = f.orig[f.orig.rfind("\n", 0, m.start()) + 1:f.orig.find("\n", m.start())]
            self.add(f, m.start(), segs, False, text)

def tree(toks, i, prefix, out):
    """Parse one use-tree from toks[i]; append (segments, alias or last name or '*') leaves."""
    path = list(prefix)
    if i < len(toks) and toks[i] == "::":
        path.append("::"); i += 1                          # `use ::x`: extern, never resolves
    while i < len(toks):
        t = toks[i]
        if t == "{":
            i += 1
            while i < len(toks) and toks[i] != "}":
                i = tree(toks, i, path, out)
                if i < len(toks) and toks[i] == ",":
                    i += 1
            return i + 1
        if t == "*":
            out.append((path, "*")); return i + 1
        path.append(t); i += 1
        if i < len(toks) and toks[i] == "::":
            i += 1; continue
        alias = None
        if i + 1 < len(toks) and toks[i] == "as":
            alias, i = toks[i + 1], i + 2
        if path[-1] == "self":
            path = path[:-1]
        if path:
            out.append((path, alias or path[-1]))
        return i
    return i

def sccs(graph):
    """Strongly connected components with more than one node: the nodes that reach each other."""
    def reach(v):
        seen, todo = set(), [v]
        while todo:
            for w in graph.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w); todo.append(w)
        return seen
    r = {v: reach(v) for v in graph}
    comps = {frozenset({v} | {w for w in r[v] if v in r.get(w, ())}) for v in graph}
    return sorted((sorted(c) for c in comps if len(c) > 1), key=lambda c: (-len(c), c))

def longest(key, prefixes):
    """The longest prefix (segment-wise) of key in prefixes, or None."""
    parts = key.split("::")
    hits = [p for p in prefixes if parts[:len(p.lstrip("!").split("::"))] == p.lstrip("!").split("::")]
    return max(hits, key=lambda p: len(p.split("::")), default=None)

def in_set(key, prefixes):
    return not (longest(key, prefixes) or "!").startswith("!")

def layer_of(key):
    hit = longest(key, [p for _, ps in LAYERS for p in ps])
    return next((i for i, (_, ps) in enumerate(LAYERS) if hit in ps), None)

def report(root):
    p = Project(root)
    allfiles = sorted(x.relative_to(root).as_posix() for x in (root / "src").rglob("*.rs"))
    lines = {rel: len((root / rel).read_text(encoding="utf-8").splitlines()) for rel in allfiles}
    folders = defaultdict(lambda: [0, 0])
    for rel in allfiles:
        row = folders[rel.rsplit("/", 1)[0]]; row[0] += 1; row[1] += lines[rel]
    # Graph without test-only occurrences; evidence = first `use` line, else first path.
    graph, evidence, test_only_edges = defaultdict(set), {}, []
    for (a, b), occ in p.edges.items():
        live = sorted((not u, ln, t) for u, ln, t, te in occ if not te)
        if live:
            graph[a].add(b); evidence[(a, b)] = f"{a.rsplit('/', 1)[-1]}:{live[0][1]}: `{live[0][2]}`"
        else:
            test_only_edges.append((a, b))
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    top = {rel: ("main" if f.crate == "bin" else f.modpath[0] if f.modpath else "lib") for rel, f in p.files.items()}
    edges = [(a, b) for a in sorted(graph) for b in sorted(graph[a])]
    fgraph, fcount = defaultdict(set), defaultdict(list)   # top-level modules; their file edges
    for a, b in edges:
        if top[a] != top[b]:
            fgraph[top[a]].add(top[b]); fcount[(top[a], top[b])].append(f"{a[4:]} -> {b[4:]}")
    fpairs = sorted({tuple(sorted((a, b))) for a in fgraph for b in fgraph[a] if a in fgraph.get(b, ())})
    key = {rel: "<main>" if f.crate == "bin" else "::".join(f.modpath) or "<lib>" for rel, f in p.files.items()}
    layer = {rel: layer_of(k) for rel, k in key.items()}
    arrow = lambda a, b: {"file": a, "target": b, "evidence": evidence[(a, b)]}
    backup = [dict(arrow(a, b), layers=[LAYERS[layer[a]][0], LAYERS[layer[b]][0]]) for a, b in edges
              if layer[a] is not None and layer[b] is not None and layer[a] < layer[b]]
    checks = {t: [arrow(a, b) for a, b in edges if in_set(key[a], src) and in_set(key[b], dst)]
              for t, src, dst in CHECKS}
    circles = sccs(graph)
    def parent_child(a, b):                # one file is the module directly above the other
        (ca, ma), (cb, mb) = (p.files[a].crate, p.files[a].modpath), (p.files[b].crate, p.files[b].modpath)
        return ca == cb and (ma == mb[:-1] or mb == ma[:-1])
    return {
        "summary": {"files": len(allfiles), "lines": sum(lines.values()), "circles": len(circles),
                    "two_file_circles": len(pairs), "folder_circles": len(sccs(fgraph)),
                    "back_up_arrows": len(backup)},
        "folders": sorted(([d, n, l] for d, (n, l) in folders.items()), key=lambda r: (-r[2], r[0])),
        "largest": sorted(([r, lines[r]] for r in allfiles), key=lambda r: (-r[1], r[0]))[:15],
        "graph": {rel: sorted(graph.get(rel, ())) for rel in sorted(p.files)},
        "test_only_files": sorted(rel for rel, f in p.files.items() if f.test),
        "test_only_edges": sorted(test_only_edges),
        "not_in_module_tree": sorted(set(allfiles) - set(p.files)),
        "evidence": {f"{a} -> {b}": e for (a, b), e in sorted(evidence.items())},
        "circles": circles,
        "two_file_circles": [{"files": list(x), "parent_child": parent_child(*x)} for x in pairs],
        "folder_circles": sccs(fgraph),
        "two_folder_circles": [{"folders": list(x), "edges": {f"{s} -> {d}": fcount[(s, d)]
                                for s, d in (x, x[::-1])}} for x in fpairs],
        "layers": {name: ps for name, ps in LAYERS},
        "unlayered_files": sorted(rel for rel in p.files if layer[rel] is None),
        "back_up_arrows": backup,
        "checks": checks,
    }

def markdown(d):
    s = lambda rel: rel.removeprefix("src/")
    cell = lambda text: text.replace("|", "\\|")  # a `|` in a Markdown table cell
    out = []; w = out.append
    sm = d["summary"]
    w("# Code structure of src/\n")
    w(f"**{sm['files']} files, {sm['lines']} lines, {sm['circles']} circles "
      f"({sm['two_file_circles']} two-file; {sm['folder_circles']} at folder level), "
      f"{sm['back_up_arrows']} back-up arrows**\n")
    w("## 1. Files per folder\n\n| folder | .rs files | lines |\n|---|---:|---:|")
    out += [f"| {f} | {n} | {l} |" for f, n, l in d["folders"]]
    w(f"| **total** | **{sm['files']}** | **{sm['lines']}** |\n")
    w("## 2. Largest files\n\n| file | lines |\n|---|---:|")
    out += [f"| {f} | {l} |" for f, l in d["largest"]]
    w("\n## 3. File-level import graph (test code excluded)\n\n| file | depends on |\n|---|---|")
    for f, deps in d["graph"].items():
        note = " *(test-only, edges excluded)*" if f in d["test_only_files"] else ""
        w(f"| {s(f)}{note} | {', '.join(s(x) for x in deps) or '—'} |")
    if d["not_in_module_tree"]:
        w(f"\nNot in the module tree (not compiled): {', '.join(d['not_in_module_tree'])}")
    w("\n## 4. Circles\n\n### Strongly connected components (files)\n")
    out += [f"{i}. ({len(c)} files) {', '.join(s(x) for x in c)}" for i, c in enumerate(d["circles"], 1)] or ["none"]
    w("\n### Two-file circles\n" + ("" if d["two_file_circles"] else "\nnone"))
    for c in d["two_file_circles"]:
        a, b = c["files"]
        kind = " (parent ↔ child)" if c["parent_child"] else ""
        w(f"- {s(a)} ↔ {s(b)}{kind}: {d['evidence'][f'{a} -> {b}']} / {d['evidence'][f'{b} -> {a}']}")
    w("\n### Folder level (top-level modules)\n")
    out += [f"- SCC: {', '.join(c)}" for c in d["folder_circles"]] or ["none"]
    w("\nTwo-folder circles, with the file edges of the thinner direction:\n" if d["two_folder_circles"] else "")
    for c in d["two_folder_circles"]:
        (e1, l1), (e2, l2) = c["edges"].items()
        thin = min((e1, l1), (e2, l2), key=lambda x: len(x[1]))
        w(f"- {' ↔ '.join(c['folders'])}: {e1} {len(l1)} file edges, {e2} {len(l2)}; "
          f"{thin[0]}: {'; '.join(thin[1])}")
    w("\n## 5. Arrows that run back up\n\nLayers, low to high: "
      + " < ".join(f"{n} ({', '.join(ps)})" for n, ps in d["layers"].items()) + "\n")
    if d["unlayered_files"]:
        w(f"Files with no layer: {', '.join(d['unlayered_files'])}\n")
    w("| file | target | layers | first line |\n|---|---|---|---|")
    out += [f"| {s(e['file'])} | {s(e['target'])} | {' → '.join(e['layers'])} | {cell(e['evidence'])} |"
            for e in d["back_up_arrows"]]
    for title, es in d["checks"].items():
        w(f"\n### {title}: {len(es)}\n")
        out += [f"- {s(e['file'])} → {s(e['target'])}: {e['evidence']}" for e in es] or ["none"]
    return "\n".join(out)

def main():
    ap = argparse.ArgumentParser(description="Report of the code structure of src/ (see the module docstring).")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="repository root")
    ap.add_argument("--json", action="store_true", help="print the data as JSON")
    args = ap.parse_args()
    d = report(args.root.resolve())
    print(json.dumps(d, indent=2) if args.json else markdown(d))

if __name__ == "__main__":
    main()
