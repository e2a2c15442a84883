//! rping end to end: two of our guests (`--nodes 2`, cx3-emu, OpenSM) run rdma-core's rping protocol against each other by IP address over IPoIB, `-C 100 -v -V`, and a client's errors come out plainly within their deadlines.
//!
//! Node 1 serves (`rping -s -v`), node 0 first tries a port nobody listens
//! on (`RDMA_CM_EVENT_REJECTED, error 8`) and an address nobody answers ARP
//! for (`RDMA_CM_EVENT_ADDR_ERROR, error -110` after rping's 2 s), then
//! pings 100 times with the data checked. Node 0's exit status is 1 (its
//! two refused runs), node 1's 0.

use std::time::{Duration, Instant};

use tests::qemu;

const CLIENT: &str = "retry -n 120 -i 1 ping -c 1 -W 1 10.0.0.2; \
     rping -c -a 10.0.0.2 -p 9 -C 1; rping -c -a 10.0.0.77 -C 1; \
     retry -n 30 -i 1 rping -c -a 10.0.0.2 -C 100 -v -V";
const SERVER: &str = "retry -n 120 -i 1 ping -c 1 -W 1 10.0.0.1; rping -s -v; sleep 2";

#[test]
fn two_of_our_guests_rping_each_other_by_ip() {
    let t = Instant::now();
    let r = qemu::run_args(
        &[
            "--nodes", "2", "--run-on", "0", CLIENT, "--run-on", "1", SERVER,
        ],
        Duration::from_secs(110),
    );
    let took = t.elapsed();
    let all = r.all();
    let (c, s) = (
        qemu::node(&r.transcript, 0).unwrap_or(""),
        qemu::node(&r.transcript, 1).unwrap_or(""),
    );
    assert!(
        c.contains("(exit 1)"),
        "the client's refused runs fail it:\n{all}"
    );
    assert!(s.contains("(exit 0)"), "{all}");
    // The refusals, in rping's words and then ours.
    assert!(
        c.contains("cma event RDMA_CM_EVENT_REJECTED, error 8"),
        "{all}"
    );
    assert!(
        c.contains("IB_CM_REJ_INVALID_SERVICE_ID: nobody listens there"),
        "{all}"
    );
    assert!(
        c.contains("cma event RDMA_CM_EVENT_ADDR_ERROR, error -110"),
        "{all}"
    );
    // 100 pings, checked, each line as rping prints it.
    let pings: Vec<&str> = c
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .collect();
    assert_eq!(pings.len(), 100, "{all}");
    assert!(
        pings[0].starts_with("ping data: rdma-ping-0: ABCDEFGHIJKL"),
        "{all}"
    );
    assert!(pings[99].starts_with("ping data: rdma-ping-99: "), "{all}");
    assert!(!c.contains("data mismatch"), "{all}");
    let served = s
        .lines()
        .filter(|l| l.starts_with("server ping data: rdma-ping-"))
        .count();
    assert_eq!(served, 100, "{all}");
    assert!(s.contains("server DISCONNECT EVENT..."), "{all}");
    assert!(c.contains("client DISCONNECT EVENT..."), "{all}");
    eprintln!("two guests, rping -C 100 -V and two refusals: {took:?}");
}
