//! The TCP transaction clients of the data-plane and Service phases: request/response on
//! one connection and connect/request/close (a new connection per transaction), a 64-byte
//! request and a 64-byte answer, one transaction at a time.
//!
//! The targets one figure compares (bare veth, cni-ebpf, the reference) are measured
//! taking turns, not one after the other. Each target gets a client thread in its client's
//! namespace, pinned to the CPU the servers are pinned to, connected and warmed up first;
//! then the threads run in turns of about [`TURN`] (the order rotating every round) until
//! each had its `secs`. A shared machine changes speed within seconds — this one moves
//! between two speeds a third apart, a few times a minute — so two targets measured
//! seconds apart can land on different speeds and their ratio says more about the machine
//! than about them. Taken in turns, every target sees the same moments. Only one client
//! runs at a time; the others wait on their channel, their connections idle.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    sync::mpsc::{channel, Receiver, Sender},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};

use super::{
    proc::{self, check_interrupt},
    report::Summary,
};

/// Request and answer size.
const MSG: usize = 64;
/// Bound on any single socket step.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// About how long one client runs before the next one takes its turn.
const TURN: Duration = Duration::from_millis(200);
/// Bound on the latencies kept per target (a transaction takes well over 1 µs).
const MAX_SAMPLES: usize = 5_000_000;

/// Which transactions a client runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Request/response on one connection.
    RequestResponse,
    /// Connect, request/response, close.
    ConnectRequestClose,
}

/// One target's figure: transactions/s and latency percentiles (µs).
#[derive(Debug, Clone, Copy)]
pub struct Rr {
    pub per_s: f64,
    pub lat: Summary,
}

fn transact(s: &mut TcpStream, req: &[u8; MSG], resp: &mut [u8; MSG]) -> std::io::Result<()> {
    s.write_all(req)?;
    s.read_exact(resp)
}

fn connect(to: SocketAddr) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&to, IO_TIMEOUT)
        .with_context(|| format!("connecting to {to}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

/// A client's side of one target: its connection (request/response) or its address.
struct Runner {
    kind: Kind,
    to: SocketAddr,
    conn: Option<TcpStream>,
    req: [u8; MSG],
    resp: [u8; MSG],
}

impl Runner {
    /// Connects (request/response) and warms up: neighbour entries, conntrack, NAT state,
    /// caches.
    fn start(kind: Kind, to: SocketAddr) -> Result<Self> {
        let (conn, fill, warm) = match kind {
            Kind::RequestResponse => (Some(connect(to)?), 0x5a, 100),
            Kind::ConnectRequestClose => (None, 0xa5, 20),
        };
        let mut r = Self {
            kind,
            to,
            conn,
            req: [fill; MSG],
            resp: [0; MSG],
        };
        for _ in 0..warm {
            r.one()?;
        }
        Ok(r)
    }

    fn one(&mut self) -> Result<()> {
        let to = self.to;
        match (self.kind, self.conn.as_mut()) {
            (Kind::RequestResponse, Some(s)) => {
                transact(s, &self.req, &mut self.resp).with_context(|| format!("request to {to}"))
            }
            _ => {
                let mut s = connect(to)?;
                transact(&mut s, &self.req, &mut self.resp)
                    .with_context(|| format!("request to {to}"))
            }
        }
    }

    /// Runs transactions for `d` (at most `room` of them): the seconds it took and each
    /// transaction's latency in µs.
    fn turn(&mut self, d: Duration, room: usize) -> Result<(f64, Vec<f64>)> {
        let mut lat = Vec::with_capacity(room.min(100_000));
        let start = Instant::now();
        while start.elapsed() < d && lat.len() < room {
            let t = Instant::now();
            self.one()?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok((start.elapsed().as_secs_f64(), lat))
    }
}

/// A turn: how long, and how many transactions at most.
type Turn = (Duration, usize);
/// What a client reports: once when it is ready (no samples), then after each turn.
type Report = Result<(f64, Vec<f64>)>;

/// One target's client thread.
struct Client {
    turns: Sender<Turn>,
    reports: Receiver<Report>,
    thread: JoinHandle<Result<()>>,
}

impl Client {
    fn start(kind: Kind, netns: &Path, to: SocketAddr) -> Self {
        let (turns, turn_rx) = channel::<Turn>();
        let (report_tx, reports) = channel::<Report>();
        let thread = proc::in_netns(netns, move || {
            testbed::servers::pin_to_last_cpu();
            let mut runner = match Runner::start(kind, to) {
                Ok(r) => r,
                Err(e) => {
                    let _ = report_tx.send(Err(e));
                    return Ok(());
                }
            };
            if report_tx.send(Ok((0.0, Vec::new()))).is_err() {
                return Ok(());
            }
            // Until the sender is dropped (the measurement is over) or a turn fails.
            while let Ok((d, room)) = turn_rx.recv() {
                let r = runner.turn(d, room);
                let failed = r.is_err();
                if report_tx.send(r).is_err() || failed {
                    break;
                }
            }
            Ok(())
        });
        Self {
            turns,
            reports,
            thread,
        }
    }

    /// The client's next report; a client that ended without one failed to enter its
    /// namespace.
    fn report(&self) -> Report {
        self.reports
            .recv()
            .map_err(|_| anyhow!("the client thread ended early"))?
    }

    /// Ends the thread; its own error (entering the namespace) if it had one.
    fn stop(self) -> Result<()> {
        drop(self.turns);
        proc::join(self.thread)
    }
}

/// Measures `kind` on every target (client namespace, address) for `secs` each, the
/// targets taking turns. One result per target, in order: a target whose client fails is
/// dropped from the turns with its error; the others go on. `Err` only when interrupted.
pub fn in_turns(kind: Kind, targets: &[(&Path, SocketAddr)], secs: f64) -> Result<Vec<Result<Rr>>> {
    let clients: Vec<Client> = targets
        .iter()
        .map(|(ns, to)| Client::start(kind, ns, *to))
        .collect();
    // Every client connected and warmed up before the first turn.
    let mut acc: Vec<Result<(f64, Vec<f64>)>> = clients.iter().map(Client::report).collect();
    let rounds = (secs / TURN.as_secs_f64()).ceil().max(1.0) as usize;
    let turn = Duration::from_secs_f64(secs / rounds as f64);
    let n = clients.len();
    let mut interrupted = Ok(());
    'rounds: for round in 0..rounds {
        for k in 0..n {
            if let Err(e) = check_interrupt() {
                interrupted = Err(e);
                break 'rounds;
            }
            let i = (round + k) % n;
            let Ok((el, lat)) = &mut acc[i] else { continue };
            let room = MAX_SAMPLES.saturating_sub(lat.len());
            let got = clients[i]
                .turns
                .send((turn, room))
                .map_err(|_| anyhow!("the client thread ended early"))
                .and_then(|()| clients[i].report());
            match got {
                Ok((e, l)) => {
                    *el += e;
                    lat.extend(l);
                }
                Err(e) => acc[i] = Err(e),
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    for (c, a) in clients.into_iter().zip(acc) {
        let stopped = c.stop();
        out.push(stopped.and(a).map(|(el, lat)| Rr {
            per_s: if el > 0.0 { lat.len() as f64 / el } else { 0.0 },
            lat: Summary::of(&lat),
        }));
    }
    interrupted?;
    Ok(out)
}
