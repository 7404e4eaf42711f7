//! The image's runtime, without Docker: a scan read end to end by a
//! `docstream all` run as the image runs it. It runs as a user that is not
//! root (uid 10001, the image's `docstream`), with the OCR tools of
//! `deploy/runtime-packages.txt` (the list the image's runtime stage
//! installs; the suite's scripts install it here), and no variable but its
//! settings and a `PATH`. Its root filesystem is read-only, except the files
//! folder and a fresh `/tmp`, as the chart's `readOnlyRootFilesystem` with
//! its two volumes.
//!
//! The read-only root is a private mount namespace (`unshare`): its copy of
//! / remounted read-only, a fresh tmpfs on /tmp, the files folder mounted
//! read-write at its path (see [`CONFINE`]). That takes
//! root, as the suite runs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::common::scans::render;
use crate::common::{self, TestEnv};

/// The image's user.
const IMAGE_UID: u32 = 10001;

/// What the namespace runs before `docstream`: `$FILES` is the files folder,
/// `$BIN_DIR` the binary's, then the command. The host's /tmp is held at
/// /mnt while / turns read-only and /tmp becomes a fresh tmpfs; a folder the
/// process needs that was under /tmp (a clone in /tmp keeps its target
/// folder there) is mounted back at its path, the binary's read-only. `-n`:
/// no mount table written, on a root that is read-only or the host's.
const CONFINE: &str = r#"set -e
mount -n --bind /tmp /mnt
mount -n -o remount,bind,ro /
mount -n -t tmpfs -o mode=1777 tmpfs /tmp
place() {
    case "$1" in
        /tmp/*) mkdir -p "$1"; mount -n --bind "/mnt/${1#/tmp/}" "$1" ;;
        *) mount -n --bind "$1" "$1" ;;
    esac
    mount -n -o "remount,bind,$2" "$1"
}
place "$BIN_DIR" ro
place "$FILES" rw
exec setpriv --reuid="$UID_AS" --regid="$UID_AS" --clear-groups --inh-caps=-all -- "$@""#;

#[tokio::test]
async fn a_scan_is_read_as_the_image_reads_it_unprivileged_on_a_read_only_root() {
    assert!(
        nix_is_root(),
        "this test makes a mount namespace: run the suite as root, as scripts/test.sh does in CI"
    );
    // The files folder, owned by the image's user.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    std::os::unix::fs::chown(&files, Some(IMAGE_UID), Some(IMAGE_UID)).unwrap();
    // The user reaches it through the temporary folder.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let files_dir = files.display().to_string();
    let env = TestEnv::with_settings("image_ocr", |s| s.files_dir = files_dir).await;

    let port = common::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = common::log_path("image-all");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let out = std::fs::File::create(&log).unwrap();
    let mut command = tokio::process::Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            CONFINE,
            "confine",
        ])
        .arg(env!("CARGO_BIN_EXE_docstream"))
        .arg("all")
        .env_clear()
        .envs(env.child_env())
        .env("DOCSTREAM_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("FILES", &files)
        .env(
            "BIN_DIR",
            Path::new(env!("CARGO_BIN_EXE_docstream")).parent().unwrap(),
        )
        .env("UID_AS", IMAGE_UID.to_string())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true);
    let mut child = command.spawn().expect("unshare");
    common::wait_healthy(&base).await;

    // The receipt sample, scanned at 200 dpi: no text layer, OCR only.
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/files");
    let pdf = std::fs::read(samples.join("receipt-bakery.pdf")).unwrap();
    let sample: Value = serde_json::from_str(
        &std::fs::read_to_string(samples.join("receipt-bakery.json")).unwrap(),
    )
    .unwrap();
    let client = env.client();
    let uploaded: Value = client
        .post(format!("{base}/v1/files"))
        .header("content-type", "image/png")
        .body(render(&pdf, 200, "png"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut request = sample["request"].clone();
    request["document"] = serde_json::json!({"object": uploaded["id"]});
    let answer = client
        .post(format!("{base}/v1/extractions"))
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let id = answer.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = format!("{base}/v1/extractions/{id}");
    let job = common::jobs::finished(&client, &url, Duration::from_secs(90)).await;
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(job["status"], "succeeded", "{job}\n{}", logged());
    let fields = &job["result"]["fields"];
    assert_eq!(fields["total"]["value"], "8.60", "{job}");
    assert_eq!(fields["date"]["value"], "2026-11-28", "{job}");
    assert_eq!(fields["card_last4"]["value"], "4417", "{job}");

    // Confined as said: not root, and the root filesystem not writable.
    let pid = child.id().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|u| u == IMAGE_UID.to_string()),
        "{uid_line}"
    );
    // The root it sees is the mount at / that no other mount at / covers.
    let at_root: Vec<Vec<&str>> = (mounts.lines())
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f[4] == "/")
        .collect();
    let covered = |id: &str| at_root.iter().any(|f| f[1] == id);
    let root = (at_root.iter())
        .find(|f| !covered(f[0]))
        .expect("a root mount");
    assert!(root[5].starts_with("ro"), "{mounts}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

/// Whether this process runs as root.
fn nix_is_root() -> bool {
    // SAFETY: geteuid reads the process's effective user id and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
