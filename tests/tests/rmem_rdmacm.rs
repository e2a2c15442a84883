//! rmem by IP address under the real OpenSM: a memory node serving on the IB CM and on the RDMA CM at once, a compute node reaching it by IPv4 address (IPoIB ARP, the SA's route, the RDMA CM's REQ with the cma header) and another connection by LID beside it, data written and read back over both; an address nobody answers and a port nobody listens on each a clear error within the deadline.
//!
//! Model HCAs on the `--nodes 2` topology under Debian's OpenSM, each guest an
//! IP stack whose `ib0` is its ipoib link, addressed 10.0.0.N/24 (the bring-up
//! of `subnet_opensm_rdmacm.rs`). The compute node runs in its own thread:
//! rmem's client blocks (it polls its own ib_core and IP stack while it
//! waits), while the test's thread runs OpenSM's rounds, the memory node's
//! stack and its server. Skipped loudly without the packages
//! (`scripts/deps.sh ensure_ib_peers`).

use tests::ip_node::*;
use tests::subnet_common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use ib_core::IbCore;
use ib_core::cma::{self, RdmaCmEventType};
use rmem::client::Dest;
use rmem::{Client, ClientConfig, Error, Server, ServerConfig};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(90);

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// Writes a pattern over three pages at an odd offset and reads it back.
fn write_and_check(c: &mut Client, core: &mut IbCore, salt: u8) -> Result<(), String> {
    let ch = c.alloc(core, 3 * 4096).map_err(|e| format!("alloc: {e}"))?;
    let data: Vec<u8> = (0..3 * 4096u64 - 1)
        .map(|i| (i ^ (i >> 8)) as u8 ^ salt)
        .collect();
    c.write(core, ch.addr + 1, &data)
        .map_err(|e| format!("write: {e}"))?;
    let mut back = vec![0u8; data.len()];
    c.read(core, ch.addr + 1, &mut back)
        .map_err(|e| format!("read: {e}"))?;
    if back != data {
        return Err(String::from("the data read back differs"));
    }
    c.free(core, ch).map_err(|e| format!("free: {e}"))
}

/// What the compute node's thread found.
struct Found {
    by_ip: Result<(), String>,
    by_lid: Result<(), String>,
    retries_by_ip: u64,
    /// Connecting to an address nobody answers: the error and how long.
    silent: (Result<(), Error>, Duration),
    /// Connecting to a port nobody listens on.
    no_listener: (Result<(), Error>, Duration),
}

#[test]
fn rmem_client_reaches_a_memory_node_by_ip_through_the_rdma_cm() {
    let name = "rmem_client_reaches_a_memory_node_by_ip_through_the_rdma_cm";
    if !peers_present(name) {
        return;
    }
    let mut s = subnet(name, 2);
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    let t = Instant::now();
    let mut up = false;
    while t.elapsed() < UP_LIMIT {
        sm.round(&mut [&mut a.g, &mut b.g]);
        a.step();
        b.step();
        if a.carrier() && b.carrier() {
            up = true;
            break;
        }
        std::thread::yield_now();
    }
    assert!(up, "both ib0 up\n{}", sm.current_log());
    let b_lid = b.g.port(1).lid;

    // The memory node: 1 MiB, the IB CM listener as always, and the RDMA
    // CM's on any address, rmem's port.
    let cm = ib_core::cm::init(&mut b.g.core);
    let mut srv =
        Server::export(&mut b.g.core, cm, b.g.dev, 1 << 20, ServerConfig::default()).unwrap();
    srv.listen_ip(
        &mut b.g.core,
        b.cma,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, rmem::IP_PORT),
    )
    .unwrap();
    assert_eq!(
        srv.ip_addr(&mut b.g.core),
        Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, rmem::IP_PORT))
    );

    // The compute node in its own thread.
    let compute = std::thread::spawn(move || {
        let cfg = ClientConfig {
            connect_timeout: Duration::from_secs(30),
            ..ClientConfig::default()
        };
        let dst = SocketAddrV4::new(ip("10.0.0.2"), rmem::IP_PORT);
        let cma = a.cma;
        let r = a.with_net(|core, net| Client::connect_ip(core, cma, net, dst, cfg));
        let (by_ip, mut ipc, retries_by_ip) = match r {
            Ok(mut c) => {
                let retries = c.stats().retries;
                let r = write_and_check(&mut c, &mut a.g.core, 0x5a);
                (r, Some(c), retries)
            }
            Err(e) => (Err(format!("connect_ip: {e}")), None, 0),
        };
        // The LID way on the same memory node, beside the IP connection.
        let (sa, cm) = (a.g.sa, ib_core::cm::init(&mut a.g.core));
        let by_lid = match Client::connect_to(&mut a.g.core, cm, sa, a.g.dev, Dest::Lid(b_lid), cfg)
        {
            Ok(mut c) => {
                let r = write_and_check(&mut c, &mut a.g.core, 0xc3);
                let _ = c.close(&mut a.g.core);
                r
            }
            Err(e) => Err(format!("connect by LID: {e}")),
        };
        if let Some(c) = ipc.take() {
            let _ = c.close(&mut a.g.core);
        }
        // An address nobody answers ARP for, and a port nobody listens on.
        let short = ClientConfig {
            connect_timeout: Duration::from_secs(5),
            ..cfg
        };
        let mut attempt = |dst: SocketAddrV4| {
            let t = Instant::now();
            let r = a
                .with_net(|core, net| Client::connect_ip(core, cma, net, dst, short))
                .map(|c| {
                    let _ = c.close(&mut a.g.core);
                });
            (r, t.elapsed())
        };
        let silent = attempt(SocketAddrV4::new(ip("10.0.0.77"), rmem::IP_PORT));
        let no_listener = attempt(SocketAddrV4::new(ip("10.0.0.2"), 9));
        (
            a,
            Found {
                by_ip,
                by_lid,
                retries_by_ip,
                silent,
                no_listener,
            },
        )
    });

    // The memory node's side: OpenSM's rounds, its stack, its server,
    // until the compute node is done.
    let t = Instant::now();
    while !compute.is_finished() {
        sm.round(&mut [&mut b.g]);
        b.step();
        srv.poll(&mut b.g.core).unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "the compute node's thread never ended"
        );
        std::thread::yield_now();
    }
    let (a, f) = compute.join().expect("the compute node's thread");
    // A few more rounds: the disconnects reach the memory node.
    let t = Instant::now();
    while srv.clients() > 0 && t.elapsed() < Duration::from_secs(10) {
        sm.round(&mut [&mut b.g]);
        b.step();
        srv.poll(&mut b.g.core).unwrap();
    }

    f.by_ip.expect("connected by IP address, data checked");
    f.by_lid.expect("connected by LID beside it, data checked");
    eprintln!("by IP: {} retries", f.retries_by_ip);
    let st = srv.stats();
    assert!(st.connects >= 2 && st.hellos == 2, "{st:?}");
    assert_eq!(
        st.disconnects, st.connects,
        "every connection closed: {st:?}"
    );
    assert_eq!(srv.clients(), 0);
    let cc = cma::counters(&mut b.g.core, b.cma).unwrap();
    assert!(cc.requests >= 1, "the RDMA CM handed the REQ on: {cc:?}");

    // 10.0.0.77: no ARP answer, said so, within the 5 s deadline (and a
    // little for the last attempt's clean-up).
    let (r, took) = f.silent;
    let e = r.expect_err("nobody answers 10.0.0.77");
    assert!(
        matches!(
            e,
            Error::ConnectIp {
                event: Some(RdmaCmEventType::AddrError),
                status: -110,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with(
            "cannot connect to the memory node at 10.0.0.77:21069: no ARP answer from 10.0.0.77"
        ),
        "{msg}"
    );
    assert!(took < Duration::from_secs(8), "{took:?}: {msg}");
    eprintln!("10.0.0.77: {msg} after {took:?}");

    // Port 9 of the memory node: the IB CM rejects the service ID.
    let (r, took) = f.no_listener;
    let e = r.expect_err("nothing listens on port 9");
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::ConnectIp {
                event: Some(RdmaCmEventType::Rejected),
                status: 8,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        msg.contains("IB_CM_REJ_INVALID_SERVICE_ID: nothing listens on that port"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(8), "{took:?}: {msg}");
    eprintln!("port 9: {msg} after {took:?}");

    srv.close(&mut b.g.core).unwrap();
    a.teardown();
    b.teardown();
    s.sm.stop();
}
