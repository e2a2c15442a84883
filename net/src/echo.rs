//! The echo service of RFC 862 on port 7, over UDP and TCP, as inetd's built-in `echo` serves it.
//!
//! Leaves out: the other inetd built-ins (discard, chargen, daytime). Each
//! link gets one UDP socket and [`TCP_SOCKETS`] TCP sockets listening on
//! port 7, so that a peer can check a socket end to end; a TCP socket whose
//! peer has closed and whose data is all echoed closes and listens again.
//! The service runs inside the stack's poll and copies through one scratch
//! buffer: no allocation after the sockets are made.

use alloc::vec;

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};

/// The echo port.
pub const PORT: u16 = 7;
/// TCP connections served at once on each link.
pub const TCP_SOCKETS: usize = 2;
/// Each TCP socket's receive and send buffer.
const TCP_BUF: usize = 64 * 1024;
/// The UDP socket's buffers: datagrams and bytes.
const UDP_PACKETS: usize = 16;
const UDP_BUF: usize = 64 * 1024;

/// One link's echo sockets.
pub struct Echo {
    udp: SocketHandle,
    tcp: [SocketHandle; TCP_SOCKETS],
}

impl Echo {
    /// Opens the sockets in `sockets`.
    pub fn open(sockets: &mut SocketSet<'static>) -> Echo {
        let mut u = udp::Socket::new(
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; UDP_PACKETS],
                vec![0; UDP_BUF],
            ),
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; UDP_PACKETS],
                vec![0; UDP_BUF],
            ),
        );
        // A fresh socket with a non-zero port always binds.
        let _ = u.bind(PORT);
        let udp = sockets.add(u);
        let tcp = core::array::from_fn(|_| {
            let mut s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; TCP_BUF]),
                tcp::SocketBuffer::new(vec![0; TCP_BUF]),
            );
            // A fresh socket with a non-zero port always listens.
            let _ = s.listen(PORT);
            sockets.add(s)
        });
        Echo { udp, tcp }
    }

    /// Echoes what has come in, listens again where a connection ended.
    pub fn run(&self, sockets: &mut SocketSet<'static>, scratch: &mut [u8]) {
        let u = sockets.get_mut::<udp::Socket>(self.udp);
        while u.can_send() {
            let Ok((n, meta)) = u.recv_slice(scratch) else {
                break;
            };
            // The reply goes from the address the datagram came to.
            let reply = udp::UdpMetadata {
                endpoint: meta.endpoint,
                local_address: meta.local_address,
                meta: meta.meta,
            };
            let _ = u.send_slice(&scratch[..n], reply);
        }
        for &h in &self.tcp {
            let s = sockets.get_mut::<tcp::Socket>(h);
            if !s.is_open() {
                // Closed, or TIME-WAIT: listen again (a fresh socket with a
                // non-zero port always listens).
                let _ = s.listen(PORT);
                continue;
            }
            while s.can_recv() && s.can_send() {
                let room = s.send_capacity() - s.send_queue();
                let want = room.min(scratch.len());
                let n = match s.recv_slice(&mut scratch[..want]) {
                    Ok(n) if n > 0 => n,
                    _ => break,
                };
                let _ = s.send_slice(&scratch[..n]);
            }
            // The peer has said all it will and everything went back.
            if s.state() == tcp::State::CloseWait && s.recv_queue() == 0 && s.send_queue() == 0 {
                s.close();
            }
        }
    }
}
