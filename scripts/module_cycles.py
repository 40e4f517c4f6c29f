#!/usr/bin/env python3
"""Finds import cycles between the files of each crate of the workspace.

A file imports another when it takes a name defined there: through `use`
(`crate::`, `super::`, `self::` or the crate's own name), through an
inline path (`crate::stats::STATS_LEN`), or through a module alias a `use`
brought in (`use super::stats;` then `stats::X`). A re-export (`pub use`)
is an import of the file that defines the name, and a name reached through
one resolves to where it is defined. A parent's `mod x;` is not an import,
nor are its paths into the children it declares (`rx::handle_frame` in the
module that declares `mod rx;`): a module owns its children, which may use
what it shares with them. `#[cfg(test)]` modules are left out: tests may
reach anywhere.

Prints every cycle (a strongly connected set of two or more files, with
the names each takes from the next) and exits 1 if there is one, 0 if the
workspace's file graph is a DAG. CI runs it (scripts/test.sh, stage
layout); `python3 scripts/module_cycles.py [REPO]`.

Why a script and not a tool: cargo-modules checks this too, but builds
rust-analyzer's crates (minutes on a 2-core CI machine) and resolves more
than a layering rule needs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field

ITEM = re.compile(
    r"\b(?:struct|enum|fn|const|static|trait|type|union|mod)\s+(?:mut\s+)?([A-Za-z_]\w*)"
    r"|\bmacro_rules!\s*([A-Za-z_]\w*)"
)
USE = re.compile(r"\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::[A-Za-z_]\w*)+)")
INLINE_MOD = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*\{")
CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def strip(text: str) -> str:
    """The text with comments, strings and char literals blanked (lengths
    kept, so offsets still line up)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = len(re.match(r"r(#*)", text[i:]).group(1))
            end = '"' + "#" * hashes
            j = text.find(end, i + 2 + hashes)
            j = n if j < 0 else j + len(end)
            blank(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:i + 12])
            if m:
                blank(i, i + m.end())
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def drop_test_modules(code: str) -> str:
    """The code without its `#[cfg(test)] mod x { ... }` blocks."""
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + " " * (j - m.start()) + code[j:]


def use_paths(tree: str) -> list[tuple[list[str], str | None]]:
    """A use tree's leaves as (path segments, alias or None); `*` is a
    segment; `self` inside braces names the prefix itself."""
    # `as` marked with "@" (no path has one) before the whitespace goes.
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))

    def expand(prefix: list[str], t: str) -> list[tuple[list[str], str | None]]:
        if "{" in t and t.endswith("}"):
            head, body = t[: t.index("{")], t[t.index("{") + 1 : -1]
            head_segs = [s for s in head.split("::") if s]
            parts, depth, cur = [], 0, ""
            for ch in body:
                if ch == "," and depth == 0:
                    parts.append(cur)
                    cur = ""
                    continue
                depth += {"{": 1, "}": -1}.get(ch, 0)
                cur += ch
            if cur:
                parts.append(cur)
            out = []
            for p in parts:
                if p == "self":
                    out.append((prefix + head_segs, None))
                else:
                    out.extend(expand(prefix + head_segs, p))
            return out
        t, _, alias = t.partition("@")
        return [(prefix + [s for s in t.split("::") if s], alias or None)]

    return expand([], tree)


@dataclass
class Module:
    path: tuple[str, ...]
    file: str
    items: set[str] = field(default_factory=set)
    reexports: dict[str, list[str]] = field(default_factory=dict)  # name -> absolute path
    globs: list[list[str]] = field(default_factory=list)


@dataclass
class Crate:
    name: str  # as a path segment (dashes as underscores)
    root: str
    modules: dict[tuple[str, ...], Module] = field(default_factory=dict)
    edges: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # file -> file -> names


def module_path(src: str, f: str) -> tuple[str, ...] | None:
    rel = os.path.relpath(f, src)
    parts = rel[:-3].split(os.sep)
    if parts[0] == "bin" or parts == ["main"]:
        return None  # binaries are crates of their own, above the library
    if parts == ["lib"]:
        return ()
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


class Resolver:
    def __init__(self, crate: Crate) -> None:
        self.c = crate

    def absolute(self, here: tuple[str, ...], segs: list[str]) -> list[str] | None:
        if not segs:
            return None
        if segs[0] in ("crate", self.c.name):
            return segs[1:]
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not base:
                    return None
                base.pop()
            segs = segs[1:]
        return base + segs

    def split(self, path: list[str]) -> tuple[tuple[str, ...], list[str]]:
        """The longest prefix of `path` that is a module, and the rest."""
        for k in range(len(path), -1, -1):
            if tuple(path[:k]) in self.c.modules:
                return tuple(path[:k]), path[k:]
        return (), path

    def defining_file(self, path: list[str], depth: int = 0) -> str | None:
        """The file that defines the item at absolute `path` (through
        re-exports), or the module's own file when the path names a module."""
        if depth > 8:
            return None
        mod, rest = self.split(path)
        m = self.c.modules.get(mod)
        if m is None:
            return None
        if not rest or rest[0] == "*":
            return m.file
        name = rest[0]
        if name in m.items:
            return m.file
        if name in m.reexports:
            return self.defining_file(m.reexports[name] + rest[1:], depth + 1)
        for g in m.globs:
            got = self.defining_file(g + rest, depth + 1)
            if got is not None:
                return got
        return None


def inline_mod_spans(code: str) -> list[tuple[int, int, str]]:
    spans = []
    for m in INLINE_MOD.finditer(code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        spans.append((m.start(), j, m.group(1)))
    return spans


def scope_at(spans: list[tuple[int, int, str]], pos: int) -> list[str]:
    return [name for a, b, name in spans if a < pos < b]


def load_crate(root: str, name: str) -> Crate:
    crate = Crate(name=name, root=root)
    src = os.path.join(root, "src")
    codes: dict[str, str] = {}
    file_paths: dict[str, tuple[str, ...]] = {}
    for d, _, files in os.walk(src):
        for fn in sorted(files):
            if not fn.endswith(".rs"):
                continue
            f = os.path.join(d, fn)
            path = module_path(src, f)
            if path is None:
                continue
            with open(f, encoding="utf-8") as fh:
                code = drop_test_modules(strip(fh.read()))
            codes[f] = code
            file_paths[f] = path
            crate.modules[path] = Module(path=path, file=f)
    spans_of = {f: inline_mod_spans(code) for f, code in codes.items()}
    res = Resolver(crate)
    # Items, inline modules (as modules of the same file) and re-exports.
    for f, code in codes.items():
        path, spans = file_paths[f], spans_of[f]
        for a, b, name in spans:
            inner = path + tuple(scope_at(spans, a + 1))
            crate.modules.setdefault(inner, Module(path=inner, file=f))
        for m in ITEM.finditer(code):
            scope = path + tuple(scope_at(spans, m.start()))
            crate.modules.setdefault(scope, Module(path=scope, file=f)).items.add(m.group(1) or m.group(2))
    for f, code in codes.items():
        path, spans = file_paths[f], spans_of[f]
        for m in USE.finditer(code):
            if not m.group(1):
                continue
            scope = path + tuple(scope_at(spans, m.start()))
            for segs, alias in use_paths(m.group(2)):
                absolute = res.absolute(scope, segs)
                if absolute is None:
                    continue
                mod = crate.modules[scope]
                if absolute and absolute[-1] == "*":
                    mod.globs.append(absolute[:-1])
                elif absolute:
                    mod.reexports[alias or absolute[-1]] = absolute
    # Edges.
    for f, code in codes.items():
        path, spans = file_paths[f], spans_of[f]
        out = crate.edges.setdefault(f, {})

        def add(absolute: list[str] | None, shown: str) -> None:
            if absolute is None:
                return
            target = res.defining_file(absolute)
            if target is not None and target != f:
                out.setdefault(target, set()).add(shown)

        aliases: dict[str, list[str]] = {}
        for m in USE.finditer(code):
            scope = path + tuple(scope_at(spans, m.start()))
            for segs, alias in use_paths(m.group(2)):
                if not segs or segs[0] not in ("crate", "super", "self", crate.name):
                    continue
                absolute = res.absolute(scope, segs)
                if absolute is None:
                    continue
                if absolute and absolute[-1] == "*":
                    add(absolute[:-1] + ["*"], "*")
                    continue
                add(absolute, alias or (absolute[-1] if absolute else "crate"))
                if tuple(absolute) in crate.modules:
                    aliases[alias or absolute[-1]] = absolute
        # Outside the use statements, read above (their blanks keep offsets).
        for m in INLINE.finditer(USE.sub(lambda u: " " * len(u.group(0)), code)):
            scope = path + tuple(scope_at(spans, m.start()))
            segs = m.group(1).split("::")
            absolute = res.absolute(scope, segs)
            add(absolute, segs[-1])
        for alias, target in aliases.items():
            for m in re.finditer(rf"(?<![\w:]){re.escape(alias)}::([A-Za-z_]\w*)", code):
                add(target + [m.group(1)], m.group(1))
    return crate


def cycles(edges: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Strongly connected sets of two or more files (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def workspace_crates(repo: str) -> list[tuple[str, str]]:
    with open(os.path.join(repo, "Cargo.toml"), "rb") as fh:
        ws = tomllib.load(fh)
    out = []
    for member in ws.get("workspace", {}).get("members", []):
        root = os.path.join(repo, member)
        with open(os.path.join(root, "Cargo.toml"), "rb") as fh:
            pkg = tomllib.load(fh)
        name = pkg.get("lib", {}).get("name") or pkg["package"]["name"]
        out.append((root, name.replace("-", "_")))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("repo", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    a = p.parse_args()
    repo = os.path.abspath(a.repo)
    found = 0
    for root, name in workspace_crates(repo):
        crate = load_crate(root, name)
        for comp in cycles(crate.edges):
            found += 1
            rel = lambda f: os.path.relpath(f, repo)  # noqa: E731
            print(f"cycle {found} in {os.path.relpath(root, repo)}: {len(comp)} files")
            for a_ in comp:
                for b in comp:
                    names = crate.edges.get(a_, {}).get(b)
                    if names:
                        print(f"  {rel(a_)} -> {rel(b)}: {', '.join(sorted(names))}")
    if found:
        print(f"module_cycles: {found} import cycle(s) between files of a crate; cut each by moving the "
              "shared names into a module below both (docs/ARCHITECTURE.md, layer rules)")
        return 1
    print("module_cycles: no import cycle between the files of any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
