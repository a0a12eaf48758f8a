//! Build script of `musterd` and `muster`: puts the git commit the binary is built from
//! in `MUSTER_GIT_COMMIT` for `--version` and `muster_build_info`. Outside a git
//! checkout (a source tarball) the commit is `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MUSTER_GIT_COMMIT={commit}");
    // A new commit moves HEAD's reflog; a checkout of another branch moves HEAD.
    for file in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
