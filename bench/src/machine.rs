//! A description of the machine a run happened on, for BENCHMARKS.md.

use std::path::Path;
use std::process::Command;

#[derive(Debug, Clone)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory: String,
    pub kernel: String,
    pub rustc: String,
    /// File system type holding the temp homes.
    pub filesystem: String,
}

impl Machine {
    /// Read what Linux tells about this machine; unknown parts say "unknown".
    pub fn describe(home_parent: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(0);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<f64>().ok())
            .map(|kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| format!("Linux {}", k.trim()))
            .unwrap_or_else(|_| "unknown".into());
        let rustc = Command::new("rustc")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cpu,
            cores,
            memory,
            kernel,
            rustc,
            filesystem: filesystem_of(home_parent),
        }
    }
}

/// ", without a journal" for an ext4 file system that has none (its new inodes are then
/// checked against the ones deleted lately, which makes creating files dearer).
fn journal_note(kind: &str, device: &str) -> &'static str {
    let name = device.rsplit('/').next().unwrap_or(device);
    let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task"));
    match task {
        Ok(task) if kind == "ext4" && task.trim() == "<none>" => ", without a journal",
        _ => "",
    }
}

/// The type and device of the mount holding `path` (longest mount-point prefix).
fn filesystem_of(path: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let device = fields.next()?;
            let point = fields.next()?;
            let kind = fields.next()?;
            path.starts_with(point).then(|| {
                (
                    point.len(),
                    format!("{kind}{} ({device} on {point})", journal_note(kind, device)),
                )
            })
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, description)| description)
        .unwrap_or_else(|| "unknown".into())
}
