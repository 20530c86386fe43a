//! The shim binary (`alexandria`) is linked statically on Linux with glibc: every MCP
//! client keeps one running per session, and a static-pie binary maps no libc.so,
//! ld.so or libgcc_s.so. Its resident memory drops from about 3.3 to 2.8 MiB (a dynamic
//! libc resolves its ifuncs at load, which faults in most of libc's pages), it starts
//! faster, and it runs whatever glibc the machine has.
//!
//! rustc can link a binary statically only through `-C target-feature=+crt-static`, which
//! cargo applies to every crate of a build (the daemon included, whose network code needs
//! glibc's NSS modules, loaded as shared libraries) and which breaks proc-macros. So this
//! script links only the shim's binary statically, through the linker: `-static-pie`, and
//! in a directory searched first, linker scripts named like the shared libraries rustc
//! asks for (`-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc`) that point at their static
//! archives. Where an archive is missing (a distribution without static glibc, like
//! Fedora without `glibc-static`), when cross-compiling, or with
//! `ALEXANDRIA_SHIM_DYNAMIC=1`, the shim is linked dynamically as any other binary.
//!
//! The shim must then never resolve names through NSS (`getaddrinfo`, `getpwnam`): a
//! static glibc would load the machine's NSS modules into itself. It does not: `doctor`
//! probes loopback addresses only, and the home comes from `$HOME`.
//!
//! `packaging/wheel` builds the same binary and uses this script too.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What rustc links for std on `*-linux-gnu`, and the archives each stands for.
const LIBRARIES: &[(&str, &[&str])] = &[
    ("gcc_s", &["libgcc_eh.a", "libgcc.a"]),
    ("c", &["libc.a", "libgcc.a", "libgcc_eh.a"]),
    ("m", &["libm.a"]),
    ("pthread", &["libpthread.a"]),
    ("dl", &["libdl.a"]),
    ("rt", &["librt.a"]),
    ("util", &["libutil.a"]),
];

fn main() {
    println!("cargo:rerun-if-env-changed=ALEXANDRIA_SHIM_DYNAMIC");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("HOST") != var("TARGET")
        || !var("ALEXANDRIA_SHIM_DYNAMIC").is_empty()
    {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let dir = PathBuf::from(out).join("static-shim");
    match scripts(&dir) {
        Ok(()) => {
            println!("cargo:rustc-link-arg-bin=alexandria=-L{}", dir.display());
            println!("cargo:rustc-link-arg-bin=alexandria=-static-pie");
        }
        Err(why) => println!("cargo:warning=the shim is linked dynamically: {why}"),
    }
}

/// The linker scripts, one per library, each naming its archives by full path.
fn scripts(dir: &Path) -> Result<(), String> {
    let compiler = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".into());
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (library, archives) in LIBRARIES {
        let mut paths = Vec::new();
        for archive in *archives {
            paths.push(find(&compiler, archive)?);
        }
        let script = format!("GROUP ( {} )\n", paths.join(" "));
        let file = dir.join(format!("lib{library}.so"));
        std::fs::write(&file, script)
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    Ok(())
}

/// The full path of `archive` as the C compiler (the linker driver) finds it.
fn find(compiler: &str, archive: &str) -> Result<String, String> {
    let output = Command::new(compiler)
        .arg(format!("-print-file-name={archive}"))
        .output()
        .map_err(|e| format!("cannot run {compiler}: {e}"))?;
    let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
    // Not found, the driver prints the bare name back.
    if !output.status.success() || !Path::new(&path).is_absolute() || !Path::new(&path).exists() {
        return Err(format!("{compiler} finds no {archive}"));
    }
    if path.contains(char::is_whitespace) || path.contains(['(', ')', '"']) {
        return Err(format!(
            "{archive} is at a path a linker script cannot name: {path}"
        ));
    }
    Ok(path)
}
