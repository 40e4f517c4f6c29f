"""scripts/module_cycles.py: finds import cycles between a crate's files,
through use trees, inline paths, aliases and re-exports, and ignores what
is not an import (comments, strings, tests, a parent's `mod x;`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "module_cycles.py")


def _workspace(tmp_path, files: dict[str, str]) -> str:
    (tmp_path / "Cargo.toml").write_text('[workspace]\nmembers = ["demo"]\n')
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "Cargo.toml").write_text('[package]\nname = "demo-crate"\nversion = "0.1.0"\n')
    for path, text in files.items():
        p = tmp_path / "demo" / "src" / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return str(tmp_path)


def _run(repo: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, repo], capture_output=True, text=True, timeout=60)


LIB = "pub mod wire;\npub mod tag;\npub mod net;\n"


def test_a_cycle_through_use_and_an_inline_path_is_named(tmp_path):
    repo = _workspace(tmp_path, {
        "lib.rs": LIB,
        "wire.rs": "use crate::tag::Tag;\npub struct Header;\n",
        "tag.rs": "pub struct Tag;\nfn f() -> usize { crate::wire::Header; 0 }\n",
        "net/mod.rs": "pub mod io;\n",
        "net/io.rs": "use super::super::wire::Header;\n",
    })
    r = _run(repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "demo/src/wire.rs -> demo/src/tag.rs: Tag" in r.stdout, r.stdout
    assert "demo/src/tag.rs -> demo/src/wire.rs: Header" in r.stdout, r.stdout
    assert "io.rs" not in r.stdout.split("module_cycles:")[0], r.stdout  # an edge, not in the cycle


def test_a_layered_crate_passes_and_what_is_not_an_import_is_ignored(tmp_path):
    repo = _workspace(tmp_path, {
        "lib.rs": LIB + "pub use wire::Header;\n",
        "wire.rs": textwrap.dedent("""\
            //! Uses crate::tag::Tag in a comment only.
            use crate::tag::Tag;
            pub struct Header(Tag);
            const S: &str = "crate::net::Sock";
            #[cfg(test)]
            mod tests {
                use crate::net::Sock;
            }
            """),
        "tag.rs": "pub struct Tag;\n",
        "net/mod.rs": "pub mod io;\npub struct Sock;\nuse crate::Header;\n",
        "net/io.rs": "use super::Sock;\n",
    })
    r = _run(repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no import cycle" in r.stdout


def test_a_cycle_hidden_behind_a_reexport_and_an_alias_is_found(tmp_path):
    # tag.rs takes Header through lib.rs's re-export, and wire.rs reaches
    # tag.rs through the module alias `tag`.
    repo = _workspace(tmp_path, {
        "lib.rs": LIB + "pub use wire::Header;\n",
        "wire.rs": "use crate::tag;\npub struct Header;\nfn f() { let _ = tag::LEN; }\n",
        "tag.rs": "pub const LEN: usize = 16;\nuse crate::Header;\n",
        "net/mod.rs": "",
    })
    r = _run(repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "demo/src/tag.rs -> demo/src/wire.rs: Header" in r.stdout, r.stdout
    assert "demo/src/wire.rs -> demo/src/tag.rs: LEN" in r.stdout, r.stdout


def test_names_with_as_inside_them_are_not_taken_for_aliases(tmp_path):
    # "Broadcast" holds "as"; "Tag as T" is an alias. Both edges count.
    repo = _workspace(tmp_path, {
        "lib.rs": LIB,
        "wire.rs": "use crate::tag::{Broadcast};\npub struct Header;\n",
        "tag.rs": "pub struct Broadcast;\nuse crate::wire::{Header as H};\n",
        "net/mod.rs": "",
    })
    r = _run(repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "demo/src/wire.rs -> demo/src/tag.rs: Broadcast" in r.stdout, r.stdout
    assert "demo/src/tag.rs -> demo/src/wire.rs: H" in r.stdout, r.stdout
