//! Traffic control through rtnetlink, synchronously: which filters a device's clsact
//! hooks run (to tell whether our programs are attached as legacy filters), removing one
//! of them, and the device's qdiscs (`fq` at the root where paced packets leave).
//!
//! Synchronous because the callers sit on both sides of the async netlink code (inside
//! ADD's runtime and outside it); each call is one request on its own socket.

use std::io;

use netlink_packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use netlink_packet_route::{
    tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The clsact hook a filter sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `ffff:fff2`: packets the device receives.
    Ingress,
    /// `ffff:fff3`: packets the device sends.
    Egress,
}

impl Hook {
    fn parent(self) -> TcHandle {
        TcHandle {
            major: 0xffff,
            minor: match self {
                Self::Ingress => TcHandle::MIN_INGRESS,
                Self::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

/// One filter of a clsact hook, as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Priority (lower runs first).
    pub priority: u16,
    /// Filter handle within the priority.
    pub handle: u32,
    /// Classifier kind (`bpf`, `u32`, `matchall`, …).
    pub kind: String,
    /// For `bpf` filters: the program's kernel id.
    pub prog_id: Option<u32>,
    /// For `bpf` filters: the name tc shows.
    pub prog_name: Option<String>,
}

/// One qdisc of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// Its handle (`major:minor` packed).
    pub handle: u32,
    /// Its parent (`TC_H_ROOT` for the root qdisc).
    pub parent: u32,
    /// Kind (`fq`, `noqueue`, `clsact`, `ingress`, `tbf`, …).
    pub kind: String,
}

/// `TC_H_ROOT`.
pub const ROOT: u32 = 0xffff_ffff;

/// The filters on `hook` of `ifindex`. A device without a clsact (or ingress) qdisc has
/// none: the kernel answers `EINVAL`, which is returned as an empty list.
pub fn filters(ifindex: u32, hook: Hook) -> io::Result<Vec<Filter>> {
    let mut msg = TcMessage::with_index(index(ifindex)?);
    msg.header.parent = hook.parent();
    let replies = match request(
        RouteNetlinkMessage::GetTrafficFilter(msg),
        NLM_F_REQUEST | NLM_F_DUMP,
    ) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for reply in replies {
        let RouteNetlinkMessage::NewTrafficFilter(m) = reply else {
            continue;
        };
        // A priority's head entry (no handle) describes the chain, not a filter.
        if u32::from(m.header.handle) == 0 {
            continue;
        }
        let mut f = Filter {
            priority: u16::try_from(m.header.info >> 16).unwrap_or(0),
            handle: u32::from(m.header.handle),
            kind: String::new(),
            prog_id: None,
            prog_name: None,
        };
        for attr in &m.attributes {
            match attr {
                TcAttribute::Kind(k) => f.kind.clone_from(k),
                TcAttribute::Options(opts) => {
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => f.prog_id = Some(*id),
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                f.prog_name = Some(n.clone());
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        out.push(f);
    }
    Ok(out)
}

/// Deletes the filter at (`priority`, `handle`) on `hook` of `ifindex`; a filter or a
/// clsact qdisc that is not there is fine.
pub fn delete_filter(ifindex: u32, hook: Hook, priority: u16, handle: u32) -> io::Result<()> {
    let mut msg = TcMessage::with_index(index(ifindex)?);
    msg.header.parent = hook.parent();
    msg.header.handle = handle.into();
    msg.header.info = u32::from(priority) << 16 | u32::from(u16::to_be(libc::ETH_P_ALL as u16));
    msg.attributes.push(TcAttribute::Kind("bpf".into()));
    match request(
        RouteNetlinkMessage::DelTrafficFilter(msg),
        NLM_F_REQUEST | NLM_F_ACK,
    ) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The qdiscs of `ifindex`.
pub fn qdiscs(ifindex: u32) -> io::Result<Vec<Qdisc>> {
    let msg = TcMessage::with_index(index(ifindex)?);
    let replies = request(
        RouteNetlinkMessage::GetQueueDiscipline(msg),
        NLM_F_REQUEST | NLM_F_DUMP,
    )?;
    Ok(replies
        .into_iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewQueueDiscipline(m)
                if m.header.index == index_lossy(ifindex) =>
            {
                let kind = m.attributes.iter().find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                })?;
                Some(Qdisc {
                    handle: u32::from(m.header.handle),
                    parent: u32::from(m.header.parent),
                    kind,
                })
            }
            _ => None,
        })
        .collect())
}

/// Makes `kind` (which must take no options, e.g. `fq` with its defaults) the qdisc at
/// `parent` of `ifindex` ([`ROOT`], or a class of a multiqueue root), replacing whatever
/// was there.
pub fn replace_qdisc(ifindex: u32, parent: u32, kind: &str) -> io::Result<()> {
    let mut msg = TcMessage::with_index(index(ifindex)?);
    msg.header.parent = TcHandle::from(parent);
    msg.header.handle = TcHandle::from(0);
    msg.attributes.push(TcAttribute::Kind(kind.into()));
    request(
        RouteNetlinkMessage::NewQueueDiscipline(msg),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
    )
    .map(|_| ())
}

fn index(ifindex: u32) -> io::Result<i32> {
    i32::try_from(ifindex).map_err(|_| io::Error::from_raw_os_error(libc::ENODEV))
}

fn index_lossy(ifindex: u32) -> i32 {
    i32::try_from(ifindex).unwrap_or(-1)
}

/// Sends one request and collects the replies up to the dump's end or the ack. A netlink
/// error becomes an `io::Error` with its errno.
fn request(payload: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut msg = NetlinkMessage::from(payload);
    msg.header.flags = flags;
    msg.header.sequence_number = 1;
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
    let mut out = Vec::new();
    let mut rx = Vec::with_capacity(64 * 1024);
    loop {
        rx.clear();
        let n = socket.recv(&mut rx, 0)?;
        let mut off = 0;
        while off < n {
            let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[off..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = usize::try_from(m.header.length).unwrap_or(0);
            if len == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a netlink message of length 0",
                ));
            }
            off += (len + 3) & !3;
            match m.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        // An ack: the request succeeded.
                        None => Ok(out),
                        Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                    };
                }
                NetlinkPayload::InnerMessage(inner) => {
                    out.push(inner);
                    if !dump {
                        continue;
                    }
                }
                _ => {}
            }
        }
    }
}
