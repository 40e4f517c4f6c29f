//! Builds the XDP program and the Rust side of its map layout.
//!
//! 1. Compiles `../ebpf/agg_xdp.c` into `$OUT_DIR/agg_xdp.o`, which
//!    `src/xdp/loader.rs` embeds with `include_bytes_aligned!`.
//! 2. Parses `../ebpf/maps.h` (the one source of the map layout: sizes,
//!    counter kinds, flags, value structs) and writes `$OUT_DIR/maps.rs`:
//!    a Rust constant per `#define`/enumerator and a `#[repr(C)]` struct per
//!    C struct, each followed by compile-time assertions of its size,
//!    alignment and field offsets.
//! 3. Writes `$OUT_DIR/maps_check.c`, `_Static_assert`s of every value and
//!    offset the parser read, and has clang check it against the header. So
//!    the C compiler, this parser and rustc must all agree on the layout, or
//!    the build fails.
//!
//! Uses `$CLANG` if set, else `clang`. The parser accepts only the dialect
//! described at the top of maps.h and fails loudly on anything else.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const HINT: &str =
    "clang failed building ebpf/agg_xdp.c: install clang and libbpf-dev (scripts/setup.sh)";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let ebpf = manifest_dir.join("../ebpf");
    let src = ebpf.join("agg_xdp.c");
    let header = ebpf.join("maps.h");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-env-changed=CLANG");

    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    // Debian/Ubuntu multiarch include dir; it holds `asm/types.h`.
    let multiarch = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        other => panic!("{HINT}: unsupported target arch `{other}` for the BPF include path"),
    };
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let include = format!("-I/usr/include/{multiarch}");

    // 2 and 3 first: a drifted header should fail with its own message, not
    // with whatever the C program then fails to compile.
    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|e| panic!("reading {}: {e}", header.display()));
    let layout = parse(&text).unwrap_or_else(|e| panic!("ebpf/maps.h: {e}"));
    let check_c = out_dir.join("maps_check.c");
    std::fs::write(&check_c, c_checks(&layout, &header)).expect("writing maps_check.c");
    run_clang(
        &clang,
        &["-target", "bpf", "-fsyntax-only", "-Wall", &include],
        &check_c,
        None,
        "ebpf/maps.h and the layout switchd/build.rs read from it disagree",
    );
    std::fs::write(out_dir.join("maps.rs"), rust_items(&layout)).expect("writing maps.rs");

    // 1.
    let obj = out_dir.join("agg_xdp.o");
    run_clang(
        &clang,
        &["-O2", "-g", "-Wall", "-target", "bpf", &include, "-c"],
        &src,
        Some(&obj),
        HINT,
    );
}

fn run_clang(clang: &str, args: &[&str], src: &Path, out: Option<&Path>, hint: &str) {
    let mut cmd = Command::new(clang);
    cmd.args(args).arg(src);
    if let Some(o) = out {
        cmd.arg("-o").arg(o);
    }
    match cmd.output() {
        Ok(o) if o.status.success() => {
            let name = src.file_name().unwrap_or_default().to_string_lossy();
            let warnings = String::from_utf8_lossy(&o.stderr);
            for line in warnings.lines().filter(|l| !l.trim().is_empty()) {
                println!("cargo:warning={name}: {line}");
            }
        }
        Ok(o) => {
            eprintln!("{}", String::from_utf8_lossy(&o.stderr));
            panic!("{hint} (`{clang}` exited with {})", o.status);
        }
        Err(e) => panic!("{hint} (could not run `{clang}`: {e})"),
    }
}

/// One `#define NAME VALUE` or enumerator.
struct Const {
    name: String,
    value: u64,
    /// `ULL`/`UL` suffix: a u64 in Rust; else u32.
    wide: bool,
}

struct Field {
    name: String,
    /// Bytes of the scalar type (1, 2, 4, 8).
    size: u64,
    /// Array length, 1 for a scalar.
    len: u64,
    offset: u64,
}

struct Struct {
    name: String,
    fields: Vec<Field>,
    size: u64,
    align: u64,
}

#[derive(Default)]
struct Layout {
    consts: Vec<Const>,
    enums: Vec<Const>,
    structs: Vec<Struct>,
}

/// Removes comments, keeping line breaks so that errors name the right line.
fn strip_comments(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..]
            .find("*/")
            .ok_or_else(|| "unterminated comment".to_string())?;
        out.extend(rest[i..i + end].chars().filter(|c| *c == '\n'));
        rest = &rest[i + end + 2..];
    }
    out.push_str(rest);
    Ok(out
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n"))
}

fn parse_int(s: &str) -> Option<(u64, bool)> {
    let t = s.trim();
    let (digits, wide) = if let Some(d) = t.strip_suffix("ULL").or_else(|| t.strip_suffix("UL")) {
        (d, true)
    } else if let Some(d) = t.strip_suffix('U') {
        (d, false)
    } else {
        (t, false)
    };
    let v = if let Some(h) = digits.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()?
    } else {
        digits.parse().ok()?
    };
    Some((v, wide || v > u64::from(u32::MAX)))
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch == '_' || ch.is_ascii_alphabetic())
        && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
}

fn parse(text: &str) -> Result<Layout, String> {
    let text = strip_comments(text)?;
    let mut layout = Layout::default();
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    let mut guard: Option<String> = None;
    while let Some((n, line)) = lines.next() {
        let err = |what: &str| format!("line {n}: {what}: `{line}`");
        if line.is_empty() || line == "#endif" || line == "#include <linux/types.h>" {
            continue;
        }
        if let Some(g) = line.strip_prefix("#ifndef ") {
            guard = Some(g.trim().to_string());
            continue;
        }
        if let Some(def) = line.strip_prefix("#define ") {
            let mut parts = def.split_whitespace();
            let name = parts.next().ok_or_else(|| err("empty #define"))?;
            let value = parts.collect::<Vec<_>>().join(" ");
            if value.is_empty() && guard.as_deref() == Some(name) {
                continue;
            }
            let (value, wide) = parse_int(&value)
                .ok_or_else(|| err("a #define must be NAME INTEGER (no expressions)"))?;
            if !is_ident(name) {
                return Err(err("bad #define name"));
            }
            layout.consts.push(Const {
                name: name.to_string(),
                value,
                wide,
            });
            continue;
        }
        if let Some(rest) = line.strip_prefix("enum ") {
            let name = rest.trim_end_matches('{').trim();
            if !is_ident(name) || !rest.ends_with('{') {
                return Err(err("expected `enum NAME {`"));
            }
            loop {
                let (n, l) = lines.next().ok_or_else(|| err("enum not closed"))?;
                if l.is_empty() {
                    continue;
                }
                if l == "};" {
                    break;
                }
                let item = l.trim_end_matches(',');
                let (k, v) = item
                    .split_once('=')
                    .ok_or_else(|| format!("line {n}: enumerators need `= VALUE`: `{l}`"))?;
                let (value, _) = parse_int(v).ok_or_else(|| {
                    format!("line {n}: enumerator value must be an integer: `{l}`")
                })?;
                if !is_ident(k.trim()) {
                    return Err(format!("line {n}: bad enumerator name: `{l}`"));
                }
                layout.enums.push(Const {
                    name: k.trim().to_string(),
                    value,
                    wide: false,
                });
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("struct ") {
            let name = rest.trim_end_matches('{').trim();
            if !is_ident(name) || !rest.ends_with('{') {
                return Err(err("expected `struct NAME {`"));
            }
            let mut fields: Vec<Field> = Vec::new();
            let (mut offset, mut align) = (0u64, 1u64);
            loop {
                let (n, l) = lines.next().ok_or_else(|| err("struct not closed"))?;
                if l.is_empty() {
                    continue;
                }
                if l == "};" {
                    break;
                }
                let bad = || format!("line {n}: expected `__uN name;` or `__uN name[LEN];`: `{l}`");
                let decl = l.strip_suffix(';').ok_or_else(bad)?;
                let (ty, var) = decl.split_once(char::is_whitespace).ok_or_else(bad)?;
                let size = match ty {
                    "__u8" => 1,
                    "__u16" => 2,
                    "__u32" => 4,
                    "__u64" => 8,
                    _ => return Err(bad()),
                };
                let var = var.trim();
                let (fname, len) = match var.split_once('[') {
                    Some((f, l)) => {
                        let len = l
                            .strip_suffix(']')
                            .and_then(parse_int)
                            .map(|(v, _)| v)
                            .ok_or_else(bad)?;
                        (f.trim(), len)
                    }
                    None => (var, 1),
                };
                if !is_ident(fname) || len == 0 {
                    return Err(bad());
                }
                if offset % size != 0 {
                    return Err(format!(
                        "line {n}: field `{fname}` would follow padding: add an explicit `_pad` field"
                    ));
                }
                fields.push(Field {
                    name: fname.to_string(),
                    size,
                    len,
                    offset,
                });
                offset += size * len;
                align = align.max(size);
            }
            if fields.is_empty() {
                return Err(err("empty struct"));
            }
            if offset % align != 0 {
                return Err(err(
                    "struct ends in tail padding: add an explicit `_pad` field",
                ));
            }
            layout.structs.push(Struct {
                name: name.to_string(),
                fields,
                size: offset,
                align,
            });
            continue;
        }
        return Err(err("not in the maps.h dialect (see its header comment)"));
    }
    Ok(layout)
}

/// `port_info` -> `PortInfo`.
fn camel(name: &str) -> String {
    name.split('_')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn rust_type(size: u64) -> &'static str {
    match size {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}

fn rust_items(l: &Layout) -> String {
    let mut s = String::from(
        "// Generated by switchd/build.rs from ebpf/maps.h: edit the header, not this.\n\n",
    );
    for c in l.consts.iter().chain(&l.enums) {
        let ty = if c.wide { "u64" } else { "u32" };
        writeln!(s, "pub const {}: {ty} = {};", c.name, c.value).unwrap();
    }
    for st in &l.structs {
        let rust = camel(&st.name);
        writeln!(
            s,
            "\n/// `struct {}` of ebpf/maps.h ({} bytes, no padding).",
            st.name, st.size
        )
        .unwrap();
        writeln!(s, "#[repr(C)]").unwrap();
        writeln!(
            s,
            "#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]\npub struct {rust} {{"
        )
        .unwrap();
        for f in &st.fields {
            let ty = rust_type(f.size);
            if f.len == 1 {
                writeln!(s, "    pub {}: {ty},", f.name).unwrap();
            } else {
                writeln!(s, "    pub {}: [{ty}; {}],", f.name, f.len).unwrap();
            }
        }
        writeln!(s, "}}\n\nconst _: () = {{").unwrap();
        writeln!(
            s,
            "    assert!(core::mem::size_of::<{rust}>() == {});",
            st.size
        )
        .unwrap();
        writeln!(
            s,
            "    assert!(core::mem::align_of::<{rust}>() == {});",
            st.align
        )
        .unwrap();
        for f in &st.fields {
            writeln!(
                s,
                "    assert!(core::mem::offset_of!({rust}, {}) == {});",
                f.name, f.offset
            )
            .unwrap();
        }
        writeln!(s, "}};").unwrap();
    }
    s
}

fn c_checks(l: &Layout, header: &Path) -> String {
    let mut s = String::from("/* Generated by switchd/build.rs. */\n#include <stddef.h>\n");
    writeln!(s, "#include \"{}\"", header.display()).unwrap();
    for c in l.consts.iter().chain(&l.enums) {
        writeln!(
            s,
            "_Static_assert({n} == {v}ULL, \"build.rs read {n} = {v} from maps.h\");",
            n = c.name,
            v = c.value
        )
        .unwrap();
    }
    for st in &l.structs {
        let n = &st.name;
        writeln!(
            s,
            "_Static_assert(sizeof(struct {n}) == {}, \"struct {n}: size\");",
            st.size
        )
        .unwrap();
        writeln!(
            s,
            "_Static_assert(_Alignof(struct {n}) == {}, \"struct {n}: alignment\");",
            st.align
        )
        .unwrap();
        for f in &st.fields {
            writeln!(
                s,
                "_Static_assert(offsetof(struct {n}, {f}) == {o} && sizeof(((struct {n} *)0)->{f}) == {b}, \"struct {n}.{f}\");",
                f = f.name,
                o = f.offset,
                b = f.size * f.len
            )
            .unwrap();
        }
    }
    s
}
