//! The test harness: real `musterd` processes on loopback, driven through the SDK and
//! the `muster` CLI.
//!
//! [`Daemon::start`] builds the binaries once per test process (so `cargo test` alone is
//! enough), starts `musterd` in a fresh data directory on a loopback port below the
//! kernel's ephemeral range ([`free_port_below_ephemeral`]: no client's port-0 socket can
//! take it while the daemon is down for a restart) and waits for its JSON log to say it
//! listens. Every wait here is bounded.
//!
//! # Layout
//! - this file: [`Daemon`], [`Proc`] and the paths of the binaries.
//! - `checker`: the Jepsen-style total-queue checker with its kill -9 and power-loss nemesis.
//! - `cluster`: a cluster of musterd nodes on loopback (optionally with a relay on every
//!   path), and the checker against one under kills and partitions.
//! - `agent_chaos`: the Jepsen-style agent checker: kill -9, drain, freeze and partition
//!   of `muster work` and SDK agents (`src/bin/chaos_agent.rs`) against one daemon.
//! - `relay`: a UDP relay between an agent and the daemon that can partition them.

pub mod agent_chaos;
pub mod checker;
pub mod cluster;
pub mod relay;

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use muster_sdk::{Client, ConnectOptions, NewTask, Trust};

/// Longest a daemon may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Set (to anything) when the binaries are built already and cargo is not to be run:
/// how `.ci/run` runs tests as an unprivileged user that has no toolchain.
pub const PREBUILT_VAR: &str = "MUSTER_TEST_PREBUILT";

/// Where cargo put the binaries of this workspace, built on first use.
fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test binary>, or target/<profile>/<binary> (the benches)
        let parent = exe.parent().expect("the executable lives in a directory");
        let dir = if parent.file_name().is_some_and(|n| n == "deps") {
            parent.parent().expect("target/<profile>/deps has a parent")
        } else {
            parent
        }
        .to_path_buf();
        if std::env::var_os(PREBUILT_VAR).is_some() {
            // Run by someone without cargo (another user, in CI): the binaries are there.
            assert!(
                dir.join("musterd").is_file() && dir.join("muster").is_file(),
                "{PREBUILT_VAR} is set but {} holds no musterd and muster: build them first",
                dir.display()
            );
            return dir;
        }
        // The cargo that runs us (`cargo test`, `cargo run`), else the one on PATH: the
        // rustup proxy then picks the toolchain as it did for the build of this binary.
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "muster-daemon",
            "-p",
            "muster-tui",
            "-p",
            "muster-tests",
            "--bins",
        ]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let status = cmd.status().expect("running cargo build for the binaries");
        assert!(
            status.success(),
            "cargo build of musterd, muster and chaos_agent failed"
        );
        dir
    })
}

/// The test fixtures (`tests/fixtures`), or where `MUSTER_TEST_FIXTURES` says a copy
/// is (for a user who cannot read the checkout).
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("MUSTER_TEST_FIXTURES").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures")),
        PathBuf::from,
    )
}

/// Path of the `musterd` binary.
pub fn musterd_bin() -> PathBuf {
    bin_dir().join("musterd")
}

/// Path of the `muster` binary.
pub fn muster_bin() -> PathBuf {
    bin_dir().join("muster")
}

/// Path of the agent chaos checker's SDK agent (`src/bin/chaos_agent.rs`).
pub fn chaos_agent_bin() -> PathBuf {
    bin_dir().join("chaos_agent")
}

/// Path of the SDK's example agent.
pub fn agent_example_bin() -> PathBuf {
    bin_dir().join("examples").join("agent")
}

/// A process the test started in a process group of its own, with its stdout lines.
pub struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(cmd: Command) -> Proc {
        Proc::spawn_to(cmd, Stdio::inherit())
    }

    /// [`Proc::spawn`] with its stderr going to `stderr`.
    fn spawn_to(mut cmd: Command, stderr: Stdio) -> Proc {
        use std::os::unix::process::CommandExt;
        let mut child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starting a process");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Proc { child, lines }
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the next stdout line.
    pub fn line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Collects stdout lines until `n` of them match `pred`, failing after `timeout`.
    pub fn lines_matching(
        &self,
        n: usize,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let deadline = std::time::Instant::now() + timeout;
        let mut found = Vec::new();
        while found.len() < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => found.push(line),
                Ok(_) => {}
                Err(_) => panic!(
                    "only {} of {n} expected lines within {timeout:?}: {found:?}",
                    found.len()
                ),
            }
        }
        found
    }

    /// kill -9 of the whole process group: the process and every child it started.
    pub fn kill9(&mut self) {
        signal_group(self.child.id(), "-KILL");
        let _ = self.child.wait();
    }

    /// Sends a signal to the process group.
    pub fn signal(&self, signal: &str) {
        signal_group(self.child.id(), signal);
    }

    /// Waits for the process to exit, up to `timeout`; returns its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.kill9();
        }
    }
}

/// Sends a signal to one process (not its group).
pub fn signal_pid(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

fn signal_group(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, "--", &format!("-{pid}")])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} -{pid} failed");
}

/// A running `musterd` and its data directory.
pub struct Daemon {
    child: Option<Child>,
    /// `127.0.0.1:PORT` it listens on.
    pub addr: String,
    /// The certificate fingerprint it logged.
    pub fingerprint: String,
    data: tempfile::TempDir,
    extra_args: Vec<String>,
    /// `MUSTER_LOG` of the daemon (`info` unless a test asks for more).
    log_filter: String,
    /// Copies the daemon's stderr into `musterd.log`; ends when the daemon exits.
    log_thread: Option<std::thread::JoinHandle<()>>,
}

/// Lines of a daemon's log a failed start shows.
const START_LOG_LINES: usize = 10;

impl Daemon {
    /// Starts a daemon in a fresh data directory.
    pub fn start() -> Daemon {
        Daemon::start_with(&[])
    }

    /// Starts a daemon with extra flags.
    pub fn start_with(extra: &[&str]) -> Daemon {
        Daemon::start_in(&std::env::temp_dir(), extra)
    }

    /// Starts a daemon with extra flags, logging as `MUSTER_LOG=filter` says.
    pub fn start_logging(filter: &str, extra: &[&str]) -> Daemon {
        let data = tempfile::tempdir().expect("temporary data directory");
        Daemon::start_on(data, extra, filter)
    }

    /// Starts a daemon with extra flags, its data directory a fresh one inside `parent`
    /// (e.g. a small file system the test mounted).
    pub fn start_in(parent: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_on(
            tempfile::tempdir_in(parent).expect("temporary data directory"),
            extra,
            "info",
        )
    }

    /// Starts a daemon on a copy of the store in `store` (a `store` directory of a data
    /// directory), with extra flags: how a store written by an earlier version is opened.
    pub fn start_from(store: &Path, extra: &[&str]) -> Daemon {
        let data = tempfile::tempdir().expect("temporary data directory");
        copy_dir(store, &data.path().join("store"));
        Daemon::start_on(data, extra, "info")
    }

    fn start_on(data: tempfile::TempDir, extra: &[&str], log_filter: &str) -> Daemon {
        let port = free_port_below_ephemeral();
        let addr = port.local_addr().expect("a chosen port").to_string();
        drop(port);
        // As musterd makes its own (a wider one is narrowed, with a warning).
        std::fs::set_permissions(
            data.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("making the data directory private");
        let mut d = Daemon {
            child: None,
            addr,
            fingerprint: String::new(),
            data,
            extra_args: extra.iter().map(|s| (*s).to_owned()).collect(),
            log_filter: log_filter.to_owned(),
            log_thread: None,
        };
        d.spawn();
        d
    }

    /// The data directory.
    pub fn data(&self) -> &Path {
        self.data.path()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    fn spawn(&mut self) {
        let mut child = Command::new(musterd_bin())
            .arg("--data")
            .arg(self.data.path())
            .args(["--listen", &self.addr, "--log-format", "json"])
            .args(&self.extra_args)
            .env("MUSTER_LOG", &self.log_filter)
            // The disk alarm off unless a test turns it on with flags: a test machine's
            // free space is not the test's business.
            .env("MUSTER_DISK_ALARM_FREE_MIB", "0")
            .env("MUSTER_DISK_ALARM_FREE_PERCENT", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting musterd");
        let stderr = child.stderr.take().expect("musterd stderr");
        let (tx, rx) = mpsc::channel();
        let log_path = self.data.path().join("musterd.log");
        let log_thread = std::thread::spawn(move || {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            // Private, as everything in the data directory is (the daemon warns
            // about, and narrows, anything wider there).
            let mut log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(log_path)
                .ok();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(f) = log.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                let _ = tx.send(line);
            }
        });
        self.child = Some(child);
        self.log_thread = Some(log_thread);
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        // The log's last lines, for a start that fails: the data directory (and the log
        // in it) is gone once the test has panicked.
        let mut last: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => panic!(
                    "musterd did not report listening within {START_TIMEOUT:?} ({}); log in {}, ending:\n{}",
                    match e {
                        mpsc::RecvTimeoutError::Timeout => "still starting",
                        mpsc::RecvTimeoutError::Disconnected => "it exited",
                    },
                    self.data.path().display(),
                    Vec::from(last).join("\n")
                ),
            };
            if last.len() == START_LOG_LINES {
                last.pop_front();
            }
            last.push_back(line.clone());
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let fields = &v["fields"];
            if fields["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("musterd listening"))
            {
                self.addr = fields["addr"].as_str().expect("addr field").to_owned();
                self.fingerprint = fields["fingerprint"]
                    .as_str()
                    .expect("fingerprint field")
                    .to_owned();
                break;
            }
        }
        // Keep draining the log so the daemon never blocks on a full pipe.
        std::thread::spawn(move || while rx.recv().is_ok() {});
    }

    /// Connect options for this daemon, trusting the certificate in its data directory.
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions {
            addr: self.addr.clone(),
            trust: Trust::DataDir(self.data.path().to_path_buf()),
            ..ConnectOptions::default()
        }
    }

    /// A connected SDK client presenting `token`.
    pub async fn client_as(&self, token: &str) -> Client {
        let options = ConnectOptions {
            token: Some(token.into()),
            ..self.options()
        };
        Client::connect(options)
            .await
            .expect("connecting with a token")
    }

    /// A connected SDK client.
    pub async fn client(&self) -> Client {
        Client::connect(self.options())
            .await
            .expect("connecting to musterd")
    }

    /// Kills the daemon with SIGKILL and waits for it to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9 musterd");
            child.wait().expect("reaping musterd");
        }
        self.join_log();
    }

    fn join_log(&mut self) {
        if let Some(t) = self.log_thread.take() {
            t.join().expect("log thread");
        }
    }

    /// Everything the daemon logged so far (complete once it has stopped).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("musterd.log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for a clean exit; returns the exit status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let code = child.wait().expect("reaping musterd").code().unwrap_or(-1);
        self.join_log();
        Some(code)
    }

    /// Waits up to `timeout` for the daemon to exit on its own; returns its exit code
    /// (`Some(-1)` if a signal ended it), or `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("daemon running");
            if let Some(status) = child.try_wait().expect("try_wait musterd") {
                self.child = None;
                self.join_log();
                return Some(status.code().unwrap_or(-1));
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the daemon again on the same data directory and port.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the daemon before restarting it");
        self.spawn();
    }

    /// Runs the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_stdin(args, None)
    }

    /// Runs the CLI against this daemon with `stdin` as its input.
    pub fn cli_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new(muster_bin())
            .args(args)
            .env("MUSTER_ADDR", &self.addr)
            .env("MUSTER_DATA", self.data.path())
            .env_remove("MUSTER_PIN")
            .env_remove("MUSTER_CA")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting muster");
        let mut input = child.stdin.take().expect("muster stdin");
        if let Some(text) = stdin {
            input
                .write_all(text.as_bytes())
                .expect("writing muster stdin");
        }
        drop(input);
        child.wait_with_output().expect("running muster")
    }

    /// Starts a long-running CLI command (e.g. `muster work`) in its own process group.
    pub fn spawn_cli(&self, args: &[&str]) -> Proc {
        self.spawn_cli_env(args, &[])
    }

    /// [`Daemon::spawn_cli`] with more environment variables (set after the harness's
    /// own, so they may replace them).
    pub fn spawn_cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(muster_bin());
        cmd.args(args)
            .env("MUSTER_ADDR", &self.addr)
            .env("MUSTER_DATA", self.data.path())
            .envs(env.iter().copied());
        Proc::spawn(cmd)
    }

    /// [`Daemon::spawn_cli`] with its log (stderr, at its own default level) written to
    /// the file `log`, for the test to read as it goes.
    pub fn spawn_cli_logged(&self, args: &[&str], log: &Path) -> Proc {
        let mut cmd = Command::new(muster_bin());
        cmd.args(args)
            .env("MUSTER_ADDR", &self.addr)
            .env("MUSTER_DATA", self.data.path())
            .env_remove("MUSTER_LOG");
        Proc::spawn_to(
            cmd,
            Stdio::from(std::fs::File::create(log).expect("creating the log")),
        )
    }

    /// Starts the SDK's example agent: member, queue, capacity.
    pub fn spawn_agent(&self, member: &str, queue: &str, capacity: u32) -> Proc {
        let mut cmd = Command::new(agent_example_bin());
        cmd.args([member, queue, &capacity.to_string()])
            .env("MUSTER_ADDR", &self.addr)
            .env("MUSTER_DATA", self.data.path())
            .env("RUST_LOG", "warn");
        Proc::spawn(cmd)
    }

    /// Runs the CLI and returns its stdout, failing the test on a non-zero exit.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "muster {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Polls (bounded by `within`) until `check` holds; panics with `what` otherwise.
pub async fn until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within {within:?}");
}

/// Enqueues `count` tasks made by `task(i)` in batches of 1,000, eight batches in flight:
/// how examples fill a queue quickly.
pub async fn fill(client: &Client, queue: &str, count: usize, task: impl Fn(usize) -> NewTask) {
    let mut pending = std::collections::VecDeque::new();
    for start in (0..count).step_by(1000) {
        let batch = (start..(start + 1000).min(count)).map(&task).collect();
        pending.push_back(client.send_enqueue(queue, batch).await.expect("send"));
        if pending.len() >= 8 {
            let oldest = pending.pop_front().expect("a pending batch");
            oldest.reply().await.expect("enqueue");
        }
    }
    for p in pending {
        p.reply().await.expect("enqueue");
    }
}

/// Copies a directory tree (files and directories only).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating a directory");
    for entry in std::fs::read_dir(from).expect("reading a directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copying a file");
        }
    }
}

/// The lowest port the harness chooses for a daemon or a cluster node.
const PORTS_FROM: u16 = 10_000;

/// A socket bound to a free loopback port below the kernel's ephemeral range. Every
/// `bind` to port 0 (clients, relays) draws from that range, so none of them can take a
/// stopped daemon's port before it is restarted on it. Ports are
/// handed out in turn from a random start, so the tests of one process do not choose
/// the same port twice either.
pub fn free_port_below_ephemeral() -> UdpSocket {
    static NEXT: std::sync::Mutex<Option<u16>> = std::sync::Mutex::new(None);
    let end = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > PORTS_FROM + 1_000)
        .unwrap_or(32_768);
    let span = end - PORTS_FROM;
    let mut next = NEXT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut port = next.unwrap_or_else(|| PORTS_FROM + rand::random::<u16>() % span);
    for _ in 0..span {
        port = if port + 1 >= end {
            PORTS_FROM
        } else {
            port + 1
        };
        if let Ok(socket) = UdpSocket::bind(("127.0.0.1", port)) {
            *next = Some(port);
            return socket;
        }
    }
    panic!("no free UDP port on 127.0.0.1 between {PORTS_FROM} and {end}");
}

/// One QUIC Initial that opens a handshake and never goes on, as a spoofing or
/// stalling client sends, from its own UDP port.
pub fn half_open_initial(server: std::net::SocketAddr) -> UdpSocket {
    let mut crypto = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("TLS 1.3")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    crypto.alpn_protocols = vec![b"muster/1".to_vec()];
    let config = quinn::ClientConfig::new(std::sync::Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(crypto).expect("QUIC TLS config"),
    ));
    let mut endpoint = quinn_proto::Endpoint::new(
        std::sync::Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let now = std::time::Instant::now();
    let (_, mut conn) = endpoint
        .connect(now, config, server, "localhost")
        .expect("a client connection");
    let mut datagram = Vec::new();
    let transmit = conn
        .poll_transmit(now, 1, &mut datagram)
        .expect("an Initial to send");
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP port");
    socket
        .send_to(&datagram[..transmit.size], server)
        .expect("sending the Initial");
    socket
}
