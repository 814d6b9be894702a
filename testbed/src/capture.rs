//! A packet capture on every interface of a namespace the test made (an `AF_PACKET`
//! socket, as tcpdump opens one): what crossed the wire between simulated nodes, for the
//! tests that must find no pod payload on it. Bounded: it stops by itself after
//! [`MAX_FRAMES`] frames or [`MAX_SECONDS`].

use std::{
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// At most this many frames are kept.
pub const MAX_FRAMES: usize = 400_000;
/// A capture ends by itself after this long.
pub const MAX_SECONDS: u64 = 120;

/// One captured frame's IP header facts (frames that are not IP have none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub bytes: Vec<u8>,
}

impl Frame {
    /// Source, destination, IP protocol and (TCP/UDP) ports of an IPv4 or IPv6 frame
    /// (Ethernet, no VLAN, no IPv6 extension headers).
    #[must_use]
    pub fn ip(&self) -> Option<(IpAddr, IpAddr, u8, u16, u16)> {
        let b = &self.bytes;
        let ethertype = u16::from_be_bytes([*b.get(12)?, *b.get(13)?]);
        let (src, dst, proto, l4): (IpAddr, IpAddr, u8, usize) = match ethertype {
            0x0800 => {
                let ihl = usize::from(b.get(14)? & 0x0f) * 4;
                let a: [u8; 4] = b.get(26..30)?.try_into().ok()?;
                let d: [u8; 4] = b.get(30..34)?.try_into().ok()?;
                (a.into(), d.into(), *b.get(23)?, 14 + ihl)
            }
            0x86dd => {
                let a: [u8; 16] = b.get(22..38)?.try_into().ok()?;
                let d: [u8; 16] = b.get(38..54)?.try_into().ok()?;
                (a.into(), d.into(), *b.get(20)?, 54)
            }
            _ => return None,
        };
        let port = |at: usize| Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]));
        let (sport, dport) = if proto == 6 || proto == 17 {
            (port(l4).unwrap_or(0), port(l4 + 2).unwrap_or(0))
        } else {
            (0, 0)
        };
        Some((src, dst, proto, sport, dport))
    }

    /// Whether `needle` appears anywhere in the frame.
    #[must_use]
    pub fn contains(&self, needle: &[u8]) -> bool {
        !needle.is_empty() && self.bytes.windows(needle.len()).any(|w| w == needle)
    }
}

/// A running capture; [`Capture::stop`] ends it and returns the frames.
pub struct Capture {
    stop: Arc<AtomicBool>,
    frames: Arc<Mutex<Vec<Frame>>>,
    thread: Option<JoinHandle<()>>,
}

impl Capture {
    /// Starts capturing every frame sent or received on any interface of `netns`.
    /// Panics when the socket cannot be opened.
    #[must_use]
    #[track_caller]
    pub fn start(netns: &Path) -> Self {
        let fd = crate::net::in_netns(netns, || {
            let proto = i32::from((libc::ETH_P_ALL as u16).to_be());
            // SAFETY: plain socket(2).
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a descriptor we just opened and own.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .unwrap_or_else(|e| panic!("a packet socket in {}: {e}", netns.display()));
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: setsockopt with a correctly sized timeval.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const timeout).cast(),
                u32::try_from(size_of::<libc::timeval>()).unwrap_or(16),
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, frames) = (Arc::clone(&stop), Arc::clone(&frames));
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut buf = vec![0_u8; 65_536];
                while !stop.load(Ordering::Relaxed)
                    && started.elapsed() < Duration::from_secs(MAX_SECONDS)
                {
                    // SAFETY: recv into our buffer, of its length.
                    let n = unsafe {
                        libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                    };
                    let Ok(n) = usize::try_from(n) else {
                        continue;
                    };
                    let mut f = frames.lock().unwrap_or_else(|e| e.into_inner());
                    if f.len() >= MAX_FRAMES {
                        break;
                    }
                    f.push(Frame {
                        bytes: buf.get(..n).unwrap_or_default().to_vec(),
                    });
                }
            })
        };
        Self {
            stop,
            frames,
            thread: Some(thread),
        }
    }

    /// Ends the capture; the frames it saw.
    #[must_use]
    pub fn stop(mut self) -> Vec<Frame> {
        self.end();
        std::mem::take(&mut *self.frames.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.end();
    }
}
