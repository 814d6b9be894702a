//! Traffic servers in a namespace, for the tests, the demo and the bench: an echo server
//! (request/response and long conversations) and a server that answers with the address
//! it saw (masquerade and port-mapping checks). Each stops and joins its threads on drop.

use std::{
    io::{self, Read, Write},
    net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use crate::net::in_netns;

/// How often a server thread waiting for a connection or for data looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);

/// How an [`EchoServer`] serves its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// Each connection on a thread of its own, all at once (tests: several clients, long
    /// conversations).
    Concurrently,
    /// One connection at a time on the accepting thread, which is pinned to the last CPU:
    /// no thread start per connection and no migration, so request/response and
    /// connect-rate measurements see the network path, not the server (the bench).
    OneAtATimePinned,
}

/// A TCP echo server on `0.0.0.0:port` in a namespace: every connection gets back what it
/// sends until it closes, fails or the server stops. Stopped and joined on drop.
#[derive(Debug)]
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
    conns: Arc<Mutex<Vec<thread::JoinHandle<()>>>>,
}

impl EchoServer {
    /// Starts the server in `netns` on `port`.
    pub fn start(netns: &Path, port: u16, serving: Serving) -> io::Result<Self> {
        // `[::]`: both families (IPv4 clients arrive as IPv4-mapped addresses).
        let listener = in_netns(netns, move || {
            TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        })?;
        // A second listen(2) only deepens the backlog (std uses 128): a burst of
        // connections is queued, not refused.
        // SAFETY: listen on a valid, listening socket.
        unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (s, c) = (Arc::clone(&stop), Arc::clone(&conns));
        let accept = thread::spawn(move || accept_loop(&listener, &s, &c, serving));
        Ok(Self {
            stop,
            accept: Some(accept),
            conns,
        })
    }

    /// [`EchoServer::start`] for tests, serving concurrently: panics if it cannot bind.
    #[track_caller]
    #[must_use]
    pub fn concurrent(netns: &Path, port: u16) -> Self {
        Self::start(netns, port, Serving::Concurrently)
            .unwrap_or_else(|e| panic!("echo server on {port} in {}: {e}", netns.display()))
    }
}

fn accept_loop(
    listener: &TcpListener,
    stop: &Arc<AtomicBool>,
    conns: &Mutex<Vec<thread::JoinHandle<()>>>,
    serving: Serving,
) {
    if serving == Serving::OneAtATimePinned {
        pin_to_last_cpu();
    }
    while !stop.load(Ordering::Relaxed) {
        // Wait for a connection without busy-polling, waking every tick to check `stop`.
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let tick_ms = i32::try_from(TICK.as_millis()).unwrap_or(100);
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&raw mut pfd, 1, tick_ms) } <= 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        match serving {
            Serving::OneAtATimePinned => echo(conn, stop),
            Serving::Concurrently => {
                let s = Arc::clone(stop);
                let handle = thread::spawn(move || echo(conn, &s));
                if let Ok(mut g) = conns.lock() {
                    g.push(handle);
                }
            }
        }
    }
}

/// Echoes `conn` until it closes, fails or `stop` is set.
fn echo(mut conn: TcpStream, stop: &AtomicBool) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    converse(&mut conn, stop, TICK, 64 * 1024, |c, data| {
        c.write_all(data)
    });
}

/// Reads `conn` (at most `buf_len` bytes a read) and hands each read to `answer`, until
/// the peer closes, a read or `answer` fails, or `stop` is set; `stop` is looked at every
/// `tick` while the peer is silent.
pub fn converse(
    conn: &mut TcpStream,
    stop: &AtomicBool,
    tick: Duration,
    buf_len: usize,
    mut answer: impl FnMut(&mut TcpStream, &[u8]) -> io::Result<()>,
) {
    let _ = conn.set_read_timeout(Some(tick));
    let mut buf = vec![0u8; buf_len];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if answer(conn, &buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let conns = self.conns.lock().map(|mut g| std::mem::take(&mut *g));
        for c in conns.unwrap_or_default() {
            let _ = c.join();
        }
    }
}

/// Pins the calling thread to the machine's last CPU. The bench's request/response
/// client and its echo servers all run there, so a transaction never waits for a
/// cross-CPU wake-up (which on a VM costs tens of µs and would otherwise make latencies
/// bimodal, depending on where the scheduler happened to put the two threads) and the
/// figures measure the network path.
pub fn pin_to_last_cpu() {
    let n = thread::available_parallelism().map_or(1, usize::from);
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it; pid 0 = this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(n - 1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A TCP and UDP server in a namespace that answers every connection or datagram with
/// the peer's address as it sees it (`ip:port\n`) followed by the bytes it received — so
/// masquerade and port-mapping tests can check which source address arrived. Listens on
/// `[::]:port` (both families). Stopped and joined on drop.
#[derive(Debug)]
pub struct WhoAmIServer {
    port: u16,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
    netns: PathBuf,
}

impl WhoAmIServer {
    /// Starts the server in `netns` on `port` (TCP and UDP). Panics if it cannot bind.
    #[track_caller]
    #[must_use]
    pub fn start(netns: &Path, port: u16) -> Self {
        Self::start_with(netns, port, None)
    }

    /// [`Self::start`] of a server that also names itself: its answer's second line is
    /// `name` (for telling apart the backends behind one Service address).
    #[track_caller]
    #[must_use]
    pub fn named(netns: &Path, port: u16, name: &str) -> Self {
        Self::start_with(netns, port, Some(name.to_owned()))
    }

    #[track_caller]
    fn start_with(netns: &Path, port: u16, name: Option<String>) -> Self {
        let bind = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let line = name.map(|n| format!("{n}\n")).unwrap_or_default();
        let line2 = line.clone();
        let (tcp, udp) = in_netns(netns, move || {
            (TcpListener::bind(bind), UdpSocket::bind(bind))
        });
        let tcp = tcp.unwrap_or_else(|e| panic!("bind tcp {bind} in {}: {e}", netns.display()));
        let udp = udp.unwrap_or_else(|e| panic!("bind udp {bind} in {}: {e}", netns.display()));
        let stop = Arc::new(AtomicBool::new(false));
        let tick = Some(Duration::from_millis(20));
        let _ = tcp.set_nonblocking(true);
        let _ = udp.set_read_timeout(tick);
        let s = Arc::clone(&stop);
        let tcp_thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match tcp.accept() {
                    Ok((mut conn, peer)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 512];
                        let n = conn.read(&mut buf).unwrap_or(0);
                        let _ =
                            write!(conn, "{}:{}\n{line}", peer.ip().to_canonical(), peer.port());
                        let _ = conn.write_all(&buf[..n]);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        let s = Arc::clone(&stop);
        let udp_thread = thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !s.load(Ordering::Relaxed) {
                if let Ok((n, peer)) = udp.recv_from(&mut buf) {
                    let mut reply =
                        format!("{}:{}\n{line2}", peer.ip().to_canonical(), peer.port())
                            .into_bytes();
                    reply.extend_from_slice(&buf[..n]);
                    let _ = udp.send_to(&reply, peer);
                }
            }
        });
        Self {
            port,
            stop,
            threads: vec![tcp_thread, udp_thread],
            netns: netns.to_path_buf(),
        }
    }

    /// The port it listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for WhoAmIServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                eprintln!(
                    "warning: a server thread in {} panicked",
                    self.netns.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NetNs;

    #[test]
    #[ignore = "needs root (a network namespace)"]
    fn echo_server_echoes_a_large_transfer_and_stops_on_drop() {
        let ns = NetNs::create("echo-unit");
        ns.sh(&["ip", "link", "set", "lo", "up"])
            .unwrap_or_else(|e| panic!("{e}"));
        for serving in [Serving::Concurrently, Serving::OneAtATimePinned] {
            let srv = EchoServer::start(ns.path(), 7100, serving).unwrap_or_else(|e| panic!("{e}"));
            let sent: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
            let data = sent.clone();
            let got = in_netns(ns.path(), move || -> io::Result<Vec<u8>> {
                let mut c = TcpStream::connect(("127.0.0.1", 7100))?;
                c.set_read_timeout(Some(Duration::from_secs(5)))?;
                let reader = c.try_clone()?;
                let writer = thread::spawn(move || c.write_all(&data));
                let mut got = vec![0u8; 100 * 1024];
                let mut r = reader;
                r.read_exact(&mut got)?;
                writer
                    .join()
                    .map_err(|_| io::Error::other("writer panicked"))??;
                Ok(got)
            })
            .unwrap_or_else(|e| panic!("{serving:?}: {e}"));
            assert!(
                got == sent,
                "{serving:?}: the echo differs from what was sent"
            );
            drop(srv);
        }
    }
}
