//! The background service that runs `alexandriad` in the foreground: a systemd user unit on
//! Linux, a launchd agent on macOS. Rendering is pure; the templates live in `packaging/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

const SYSTEMD_TEMPLATE: &str = include_str!("../../../packaging/systemd/alexandria.service.in");
const LAUNCHD_TEMPLATE: &str =
    include_str!("../../../packaging/launchd/dev.alexandria.daemon.plist.in");

/// Text every service file we write contains; a file without it is not ours to replace.
pub const MARKER: &str = "Written by `alexandria daemon install-service`";
pub const SYSTEMD_UNIT: &str = "alexandria.service";
pub const LAUNCHD_LABEL: &str = "dev.alexandria.daemon";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceKind {
    Systemd,
    Launchd,
}

impl ServiceKind {
    pub fn current() -> ServiceKind {
        if cfg!(target_os = "macos") {
            ServiceKind::Launchd
        } else {
            ServiceKind::Systemd
        }
    }
}

/// What the service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Absolute path of `alexandriad`.
    pub daemon: PathBuf,
    /// `ALEXANDRIA_HOME` to pass on, when the user set one.
    pub alexandria_home: Option<PathBuf>,
    /// The user's home (for the launchd log path).
    pub home: PathBuf,
}

/// Where the service file goes.
pub fn service_path(kind: ServiceKind, home: &Path, xdg_config_home: Option<&Path>) -> PathBuf {
    match kind {
        ServiceKind::Systemd => xdg_config_home
            .map(Path::to_path_buf)
            .unwrap_or_else(|| home.join(".config"))
            .join("systemd")
            .join("user")
            .join(SYSTEMD_UNIT),
        ServiceKind::Launchd => home
            .join("Library")
            .join("LaunchAgents")
            .join(format!("{LAUNCHD_LABEL}.plist")),
    }
}

pub fn render(kind: ServiceKind, config: &ServiceConfig) -> String {
    match kind {
        ServiceKind::Systemd => render_systemd(config),
        ServiceKind::Launchd => render_launchd(config),
    }
}

fn render_systemd(config: &ServiceConfig) -> String {
    let environment = match &config.alexandria_home {
        Some(home) => format!(
            "Environment={}\n",
            systemd_quote(&format!("ALEXANDRIA_HOME={}", home.display()), false)
        ),
        None => String::new(),
    };
    SYSTEMD_TEMPLATE
        .replace(
            "@DAEMON@",
            &systemd_quote(&config.daemon.display().to_string(), true),
        )
        .replace("@ENVIRONMENT@", &environment)
}

fn render_launchd(config: &ServiceConfig) -> String {
    let environment = match &config.alexandria_home {
        Some(home) => format!(
            "\t<key>EnvironmentVariables</key>\n\t<dict>\n\t\t<key>ALEXANDRIA_HOME</key>\n\t\t<string>{}</string>\n\t</dict>\n",
            xml_escape(&home.display().to_string())
        ),
        None => String::new(),
    };
    let stderr = config
        .home
        .join("Library")
        .join("Logs")
        .join("alexandriad.log");
    LAUNCHD_TEMPLATE
        .replace("@LABEL@", LAUNCHD_LABEL)
        .replace(
            "@DAEMON@",
            &xml_escape(&config.daemon.display().to_string()),
        )
        .replace("@STDERR@", &xml_escape(&stderr.display().to_string()))
        .replace("@ENVIRONMENT@", &environment)
}

/// Quote one systemd word: always double quotes, with `\` and `"` escaped, `%` doubled (it
/// starts a specifier) and, in command lines, `$` doubled (it starts a variable).
fn systemd_quote(word: &str, command_line: bool) -> String {
    let mut quoted = String::from("\"");
    for c in word.chars() {
        match c {
            '\\' => quoted.push_str("\\\\"),
            '"' => quoted.push_str("\\\""),
            '%' => quoted.push_str("%%"),
            '$' if command_line => quoted.push_str("$$"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Whether `systemctl --user` can reach a user service manager.
pub fn systemd_user_bus() -> Option<PathBuf> {
    let systemctl = super::claude_cli::find_on_path("systemctl")?;
    let reachable = Command::new(&systemctl)
        .args(["--user", "show-environment"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    reachable.then_some(systemctl)
}

/// Run a service manager command; on failure the error carries its output.
pub fn run(program: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if !output.status.success() {
        bail!(
            "`{} {}` failed ({}): {}",
            program.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Whether a command succeeds (for `systemctl is-enabled` style probes).
pub fn succeeds(program: &Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(daemon: &str, home: Option<&str>) -> ServiceConfig {
        ServiceConfig {
            daemon: PathBuf::from(daemon),
            alexandria_home: home.map(PathBuf::from),
            home: PathBuf::from("/home/u"),
        }
    }

    #[test]
    fn systemd_units() {
        let cases: Vec<(ServiceConfig, &[&str])> = vec![
            (
                config("/usr/bin/alexandriad", None),
                &[
                    "ExecStart=\"/usr/bin/alexandriad\"\n",
                    "Restart=on-failure\n",
                ],
            ),
            (
                config("/opt/my 100% $apps/alexandriad", Some("/data/a\"x")),
                &[
                    "ExecStart=\"/opt/my 100%% $$apps/alexandriad\"\n",
                    "Environment=\"ALEXANDRIA_HOME=/data/a\\\"x\"\n",
                ],
            ),
        ];
        for (config, expected) in cases {
            let unit = render(ServiceKind::Systemd, &config);
            assert!(unit.contains(MARKER));
            assert!(!unit.contains('@'), "{unit}");
            for line in expected {
                assert!(unit.contains(line), "{line:?} in {unit}");
            }
            assert_eq!(
                unit.contains("Environment="),
                config.alexandria_home.is_some()
            );
        }
    }

    #[test]
    fn launchd_agents() {
        let plist = render(
            ServiceKind::Launchd,
            &config("/Users/u/bin/a&b/alexandriad", Some("/Users/u/.alx")),
        );
        assert!(plist.contains(MARKER));
        assert!(plist.contains("<string>/Users/u/bin/a&amp;b/alexandriad</string>"));
        assert!(plist.contains("<key>ALEXANDRIA_HOME</key>\n\t\t<string>/Users/u/.alx</string>"));
        assert!(plist.contains("<string>/home/u/Library/Logs/alexandriad.log</string>"));
        assert!(!plist.contains("@"), "{plist}");
        let plain = render(ServiceKind::Launchd, &config("/bin/alexandriad", None));
        assert!(!plain.contains("EnvironmentVariables"));
    }

    #[test]
    fn paths() {
        let home = Path::new("/h");
        assert_eq!(
            service_path(ServiceKind::Systemd, home, None),
            PathBuf::from("/h/.config/systemd/user/alexandria.service")
        );
        assert_eq!(
            service_path(ServiceKind::Systemd, home, Some(Path::new("/x"))),
            PathBuf::from("/x/systemd/user/alexandria.service")
        );
        assert_eq!(
            service_path(ServiceKind::Launchd, home, None),
            PathBuf::from("/h/Library/LaunchAgents/dev.alexandria.daemon.plist")
        );
    }
}
