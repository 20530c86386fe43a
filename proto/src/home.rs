//! Where alexandria keeps its state: `$ALEXANDRIA_HOME`, default `~/.alexandria`, and
//! where the daemon's socket is (inside the home, or a short per-user path when the
//! home's path is too long for a Unix socket address).

use std::io::{self, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The environment variable that overrides the home directory (tests always set it).
pub const HOME_ENV: &str = "ALEXANDRIA_HOME";

/// Bytes in `sockaddr_un.sun_path`, including the terminating NUL: a socket's path must
/// be shorter than this.
#[cfg(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd",
    target_os = "dragonfly"
))]
pub const SUN_PATH_BYTES: usize = 104;
#[cfg(not(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd",
    target_os = "dragonfly"
)))]
pub const SUN_PATH_BYTES: usize = 108;

/// Paths inside the alexandria home (SPEC §2). Pure path arithmetic: nothing here
/// touches the file system, except the socket helpers at the end, which create and
/// check the socket's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
    /// Where the socket goes when `<home>/run/daemon.sock` is too long.
    short: ShortSocketBase,
}

/// The per-user places for a short socket path, read from the environment once when
/// the home is located, so every path the daemon and the shim compute agrees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortSocketBase {
    /// `$XDG_RUNTIME_DIR` when set and absolute.
    pub runtime_dir: Option<PathBuf>,
    /// The effective uid (names `/tmp/alexandria-<uid>/`).
    pub uid: u32,
}

impl ShortSocketBase {
    pub fn from_env() -> ShortSocketBase {
        ShortSocketBase {
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|dir| dir.is_absolute()),
            uid: rustix::process::geteuid().as_raw(),
        }
    }
}

/// Where the daemon's socket is, and which directory guards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketPlace {
    /// `<home>/run/daemon.sock`: `run/` is 0700.
    InHome { path: PathBuf },
    /// `$XDG_RUNTIME_DIR/alexandria-<hash>.sock`: the runtime directory is the user's
    /// own (0700, made by the login manager); it is checked, never created.
    RuntimeDir { dir: PathBuf, path: PathBuf },
    /// `/tmp/alexandria-<uid>/<hash>.sock`: the directory is created 0700 and refused
    /// when it is anyone else's, or open to others.
    Tmp { dir: PathBuf, path: PathBuf },
}

impl SocketPlace {
    pub fn path(&self) -> &Path {
        match self {
            SocketPlace::InHome { path }
            | SocketPlace::RuntimeDir { path, .. }
            | SocketPlace::Tmp { path, .. } => path,
        }
    }

    /// Why the socket is not in the home, for `daemon status`; `None` when it is.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            SocketPlace::InHome { .. } => None,
            SocketPlace::RuntimeDir { .. } | SocketPlace::Tmp { .. } => Some(
                "the home's path is too long for a Unix socket address, so the socket is in a short per-user directory",
            ),
        }
    }
}

impl Home {
    /// A home at `root`; the short-socket places are read from this process's
    /// environment.
    pub fn new(root: impl Into<PathBuf>) -> Home {
        Home::with_short_socket_base(root, ShortSocketBase::from_env())
    }

    pub fn with_short_socket_base(root: impl Into<PathBuf>, short: ShortSocketBase) -> Home {
        Home {
            root: root.into(),
            short,
        }
    }

    /// `$ALEXANDRIA_HOME`, else `$HOME/.alexandria`. `None` when neither is set.
    pub fn from_env() -> Option<Home> {
        if let Some(dir) = std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().ok()?.join(dir)
            };
            return Some(Home::new(dir));
        }
        let home = std::env::var_os("HOME").filter(|v| !v.is_empty())?;
        Some(Home::new(PathBuf::from(home).join(".alexandria")))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn config_file(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    pub fn state_db(&self) -> PathBuf {
        self.root.join("state.db")
    }
    pub fn secrets_dir(&self) -> PathBuf {
        self.root.join("secrets")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }
    /// The path the daemon binds and clients connect to (see `socket_place`).
    pub fn socket(&self) -> PathBuf {
        self.socket_place().path().to_path_buf()
    }
    pub fn pid_file(&self) -> PathBuf {
        self.run_dir().join("daemon.pid")
    }
    /// Held by whoever is starting a daemon, so parallel shims start exactly one.
    pub fn start_lock(&self) -> PathBuf {
        self.run_dir().join("start.lock")
    }
    pub fn templates_dir(&self) -> PathBuf {
        self.root.join("templates")
    }
    pub fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }
    pub fn workspace(&self, slug: &str) -> PathBuf {
        self.workspaces_dir().join(slug)
    }

    /// Where the socket is: `<home>/run/daemon.sock` when that fits in a socket
    /// address; else `$XDG_RUNTIME_DIR/alexandria-<hash>.sock` (when that fits), else
    /// `/tmp/alexandria-<uid>/<hash>.sock`, where `<hash>` names the home. This is the
    /// one place that decides, so the daemon and every client agree.
    pub fn socket_place(&self) -> SocketPlace {
        let in_home = self.run_dir().join("daemon.sock");
        if fits_socket_address(&in_home) {
            return SocketPlace::InHome { path: in_home };
        }
        let name = home_hash(&self.root);
        if let Some(dir) = &self.short.runtime_dir {
            let path = dir.join(format!("alexandria-{name}.sock"));
            if fits_socket_address(&path) {
                return SocketPlace::RuntimeDir {
                    dir: dir.clone(),
                    path,
                };
            }
        }
        let dir = PathBuf::from(format!("/tmp/alexandria-{}", self.short.uid));
        let path = dir.join(format!("{name}.sock"));
        SocketPlace::Tmp { dir, path }
    }

    /// Make the socket's directory ready for the daemon to bind in: `run/` or
    /// `/tmp/alexandria-<uid>/` created 0700; a directory that is not ours, or is
    /// open to other users, is refused (`PermissionDenied`).
    pub fn prepare_socket_dir(&self) -> io::Result<()> {
        match self.socket_place() {
            SocketPlace::InHome { .. } => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.run_dir()),
            SocketPlace::RuntimeDir { dir, .. } => check_private_dir(&dir, self.short.uid),
            SocketPlace::Tmp { dir, .. } => {
                match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                check_private_dir(&dir, self.short.uid)
            }
        }
    }

    /// Connect to the daemon's socket. Outside the home, the socket's directory must
    /// be ours and closed to others first (else `PermissionDenied`): whoever controls
    /// that directory controls which process answers.
    ///
    /// When nothing answers there, the socket the running daemon recorded in its pidfile
    /// is tried (same directory checks): a daemon started with another
    /// `$XDG_RUNTIME_DIR` (a service manager's environment vs. an MCP client's) is still
    /// found.
    pub fn connect_socket(&self) -> io::Result<UnixStream> {
        let (dir, path) = match self.socket_place() {
            SocketPlace::InHome { path } => return UnixStream::connect(path),
            SocketPlace::RuntimeDir { dir, path } | SocketPlace::Tmp { dir, path } => (dir, path),
        };
        let error = match check_private_dir(&dir, self.short.uid)
            .and_then(|()| UnixStream::connect(&path))
        {
            Ok(stream) => return Ok(stream),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => e,
            Err(e) => return Err(e),
        };
        let Some(recorded) = self.recorded_socket().filter(|recorded| *recorded != path) else {
            return Err(error);
        };
        match recorded.parent() {
            Some(dir) if fits_socket_address(&recorded) => {
                check_private_dir(dir, self.short.uid)?;
                UnixStream::connect(&recorded)
            }
            _ => Err(error),
        }
    }

    /// The socket path a daemon wrote on the second line of its pidfile.
    pub fn recorded_socket(&self) -> Option<PathBuf> {
        let text = std::fs::read(self.pid_file()).ok()?;
        let line = text.split(|b| *b == b'\n').nth(1)?;
        (!line.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(line)))
    }
}

/// Whether `path` fits in `sockaddr_un.sun_path` (with its NUL).
pub fn fits_socket_address(path: &Path) -> bool {
    path.as_os_str().len() < SUN_PATH_BYTES
}

/// 16 hex digits naming a home: FNV-1a (64 bit) of its path, stable across builds so
/// that an older daemon and a newer shim find the same socket.
fn home_hash(root: &Path) -> String {
    // `a//b/./c/` and `a/b/c` are the same home.
    let normalized: PathBuf = root.components().collect();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in normalized.as_os_str().as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// `dir` is a real directory (not a symlink), owned by `uid`, with no access for group
/// or others.
fn check_private_dir(dir: &Path, uid: u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    let problem = if !meta.file_type().is_dir() {
        Some("it is not a directory".to_string())
    } else if meta.uid() != uid {
        Some(format!(
            "it belongs to uid {}, not to you ({uid})",
            meta.uid()
        ))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!(
            "its mode is {:04o}; it must be 0700",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "refusing the socket directory {}: {problem} (remove it, or set XDG_RUNTIME_DIR to a private directory)",
                dir.display()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(runtime_dir: Option<&str>) -> ShortSocketBase {
        ShortSocketBase {
            runtime_dir: runtime_dir.map(PathBuf::from),
            uid: 1000,
        }
    }

    #[test]
    fn socket_place_by_length() {
        let short = Home::with_short_socket_base("/home/ada/.alexandria", base(None));
        assert_eq!(
            short.socket_place(),
            SocketPlace::InHome {
                path: "/home/ada/.alexandria/run/daemon.sock".into()
            }
        );
        let long_root = format!("/home/ada/{}", "deep folder é/".repeat(10));
        let long = Home::with_short_socket_base(&long_root, base(Some("/run/user/1000")));
        let SocketPlace::RuntimeDir { dir, path } = long.socket_place() else {
            panic!("{:?}", long.socket_place());
        };
        assert_eq!(dir, Path::new("/run/user/1000"));
        assert!(fits_socket_address(&path));
        let name = path.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(name.starts_with("alexandria-") && name.ends_with(".sock"));
        // Without XDG_RUNTIME_DIR (or when it is itself too long): /tmp/alexandria-<uid>.
        let tmp = Home::with_short_socket_base(&long_root, base(None)).socket_place();
        assert!(
            matches!(&tmp, SocketPlace::Tmp { dir, .. } if dir == Path::new("/tmp/alexandria-1000"))
        );
        let deep_runtime = format!("/run/{}", "x".repeat(120));
        let tmp2 = Home::with_short_socket_base(&long_root, base(Some(&deep_runtime)));
        assert_eq!(tmp2.socket_place(), tmp);
        assert!(tmp.reason().is_some() && short.socket_place().reason().is_none());
    }

    #[test]
    fn the_hash_names_the_home_not_its_spelling() {
        let root = format!("/data/{}", "y".repeat(120));
        let a = Home::with_short_socket_base(&root, base(None)).socket();
        let b = Home::with_short_socket_base(format!("{root}/"), base(None)).socket();
        let c =
            Home::with_short_socket_base(root.replace("/data/", "/data//./"), base(None)).socket();
        let other = Home::with_short_socket_base(format!("{root}z"), base(None)).socket();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_ne!(a, other);
        // Golden: the name must not change between builds (old daemon, new shim).
        assert_eq!(home_hash(Path::new("/a")), "07d66707b49cd92d");
    }

    #[test]
    fn a_socket_dir_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("alx-home-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("mkdir");
        let uid = rustix::process::geteuid().as_raw();
        assert!(check_private_dir(&dir, uid).is_ok());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let error = check_private_dir(&dir, uid).expect_err("0755 is open to others");
        assert_eq!(error.kind(), ErrorKind::PermissionDenied);
        assert!(error.to_string().contains("0755"), "{error}");
        let error = check_private_dir(&dir, uid.wrapping_add(1)).expect_err("not ours");
        assert!(error.to_string().contains("belongs to uid"), "{error}");
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let error = check_private_dir(&link, uid).expect_err("a symlink is refused");
        assert!(error.to_string().contains("not a directory"), "{error}");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
