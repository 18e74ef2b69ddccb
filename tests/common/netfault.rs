//! A TCP proxy for network faults: forwards 127.0.0.1:<port> to a target port, and can freeze.
//!
//! [`FreezeProxy::freeze`] models a NAT timeout or a partition: every connection open at that
//! moment stops forwarding in both directions but is never closed (no FIN, no RST), so both ends
//! see a silent, half-open link. Connections made after [`FreezeProxy::thaw`] forward normally;
//! the frozen ones stay dead until the proxy is dropped. With `freeze_new`, connections accepted
//! while frozen are held silent too (a fully blackholed route).
//!
//! [`FreezeProxy::hold_after`] models a hiccup instead: once a number of bytes have passed in one
//! direction, that direction stops forwarding (bytes wait in the socket buffers) until
//! [`FreezeProxy::release`]; then everything flows on, nothing lost. Triggering on a byte count
//! makes "in the middle of a transfer" deterministic.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub struct FreezeProxy {
    pub port: u16,
    /// Bumped by each freeze; a connection forwards only while its epoch is current.
    epoch: Arc<AtomicU64>,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    target: Arc<AtomicU16>,
    hold: Arc<Hold>,
}

/// Which way bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// Per direction: bytes left before holding (`i64::MAX`: no hold armed), and whether held.
#[derive(Default)]
struct Hold {
    budget: [AtomicI64; 2],
    held: [AtomicBool; 2],
}

impl Hold {
    fn new() -> Hold {
        let h = Hold::default();
        for b in &h.budget {
            b.store(i64::MAX, Ordering::SeqCst);
        }
        h
    }
}

impl FreezeProxy {
    pub fn start(target_port: u16) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let epoch = Arc::new(AtomicU64::new(0));
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let target = Arc::new(AtomicU16::new(target_port));
        let hold = Arc::new(Hold::new());
        let (e, f, s, c, t) = (epoch.clone(), frozen.clone(), stop.clone(), conns.clone(), target.clone());
        let h = hold.clone();
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).ok();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", t.load(Ordering::SeqCst))) else {
                            continue;
                        };
                        c.lock().unwrap().push(client.try_clone().unwrap());
                        c.lock().unwrap().push(server.try_clone().unwrap());
                        // Accepted while frozen: this connection is dead from the start.
                        let mine = if f.load(Ordering::SeqCst) { u64::MAX } else { e.load(Ordering::SeqCst) };
                        let up = Pump { epoch: e.clone(), mine, stop: s.clone(), hold: h.clone(), dir: Dir::Up };
                        pump(client.try_clone().unwrap(), server.try_clone().unwrap(), up);
                        pump(
                            server,
                            client,
                            Pump { epoch: e.clone(), mine, stop: s.clone(), hold: h.clone(), dir: Dir::Down },
                        );
                    }
                    Err(err) if err.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(20)),
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        FreezeProxy { port, epoch, frozen, stop, conns, target, hold }
    }

    /// After `bytes` more bytes have gone `dir` (counted over all connections), stop forwarding
    /// that way, keeping every connection open, until [`FreezeProxy::release`].
    pub fn hold_after(&self, dir: Dir, bytes: u64) {
        self.hold.budget[dir as usize].store(bytes as i64, Ordering::SeqCst);
    }

    /// Whether a [`FreezeProxy::hold_after`] has taken effect.
    pub fn held(&self, dir: Dir) -> bool {
        self.hold.held[dir as usize].load(Ordering::SeqCst)
    }

    /// Forward again what was held.
    pub fn release(&self, dir: Dir) {
        self.hold.budget[dir as usize].store(i64::MAX, Ordering::SeqCst);
        self.hold.held[dir as usize].store(false, Ordering::SeqCst);
    }

    /// Forward new connections to this port (for a server that must advertise the proxy).
    pub fn set_target(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    /// Close every open connection at once (both ends see the close), dropping whatever bytes a
    /// hold kept unforwarded, and forward normally from then on: a link that dies with messages
    /// in flight, then comes back at once.
    pub fn cut(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.release(Dir::Up);
        self.release(Dir::Down);
    }

    /// Stop forwarding on every open connection, without closing any; new connections are held
    /// silent too until [`FreezeProxy::thaw`].
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Let new connections through again (frozen ones stay dead).
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

struct Pump {
    epoch: Arc<AtomicU64>,
    mine: u64,
    stop: Arc<AtomicBool>,
    hold: Arc<Hold>,
    dir: Dir,
}

fn pump(mut from: TcpStream, mut to: TcpStream, p: Pump) {
    thread::spawn(move || {
        from.set_read_timeout(Some(Duration::from_millis(50))).ok();
        let mut buf = vec![0u8; 64 * 1024];
        let d = p.dir as usize;
        loop {
            if p.stop.load(Ordering::SeqCst) {
                return;
            }
            if p.epoch.load(Ordering::SeqCst) != p.mine || p.hold.held[d].load(Ordering::SeqCst) {
                // Frozen or held: read nothing more, write nothing more, keep the sockets open.
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            // Never read past an armed hold's budget, so the hold falls exactly on it.
            let budget = p.hold.budget[d].load(Ordering::SeqCst);
            let want = if budget == i64::MAX { buf.len() } else { (budget.max(1) as usize).min(buf.len()) };
            match from.read(&mut buf[..want]) {
                Ok(0) => {
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
                Ok(n) => {
                    if p.epoch.load(Ordering::SeqCst) != p.mine {
                        continue; // frozen between read and write: these bytes are lost in the void
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                    if budget != i64::MAX && p.hold.budget[d].fetch_sub(n as i64, Ordering::SeqCst) - n as i64 <= 0 {
                        p.hold.held[d].store(true, Ordering::SeqCst);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => {
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
            }
        }
    });
}
