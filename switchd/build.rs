//! Compiles the XDP steering program `../ebpf/agg_xdp.c` into
//! `$OUT_DIR/agg_xdp.o`, which `src/xdp/loader.rs` embeds with
//! `include_bytes_aligned!`. Uses `$CLANG` if set, else `clang`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const HINT: &str =
    "clang failed building ebpf/agg_xdp.c: install clang and libbpf-dev (scripts/setup.sh)";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let src = manifest_dir.join("../ebpf/agg_xdp.c");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("agg_xdp.o");
    println!("cargo:rerun-if-changed={}", src.display());
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

    let output = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output();
    match output {
        Ok(o) if o.status.success() => {
            let warnings = String::from_utf8_lossy(&o.stderr);
            for line in warnings.lines().filter(|l| !l.trim().is_empty()) {
                println!("cargo:warning=agg_xdp.c: {line}");
            }
        }
        Ok(o) => {
            eprintln!("{}", String::from_utf8_lossy(&o.stderr));
            panic!("{HINT} (`{clang}` exited with {})", o.status);
        }
        Err(e) => panic!("{HINT} (could not run `{clang}`: {e})"),
    }
}
