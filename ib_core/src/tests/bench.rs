//! Figures, not assertions: the cost of the progress function when idle and of a MAD round trip, over the fake provider.
//!
//! The provider's own cost is in them. Run with `cargo test --release -p
//! ib_core bench -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use super::*;
use crate::mad::*;
use crate::verbs::*;

#[test]
#[ignore]
fn bench_poll_idle_and_mad_round_trip() {
    let mut r = rig();
    // Idle: two devices, one port each, nothing to do.
    let n = 200_000;
    let t = Instant::now();
    let mut work = 0;
    for _ in 0..n {
        work += r.core.poll();
    }
    let idle = t.elapsed();
    assert_eq!(work, 0);
    println!(
        "IbCore::poll idle, 2 devices x 1 port: {:.0} ns per call",
        idle.as_nanos() as f64 / n as f64
    );

    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
        let mut buf = MadSendBuf::new(
            m,
            AhAttr {
                dlid: B_LID,
                port_num: 1,
                ..AhAttr::default()
            },
            1,
        );
        buf.timeout_ms = 100;
        let (done, resp) = r
            .core
            .send_mad_wait(ag, buf, Duration::from_secs(5))
            .unwrap();
        assert_eq!(done.status, WcStatus::Success);
        assert!(resp.is_some());
    }
    let rt = t.elapsed();
    println!(
        "PMA Get round trip through both MAD layers and the fake wire: {:.2} us",
        rt.as_nanos() as f64 / n as f64 / 1000.0
    );
    let m = r.core.mad_counters(r.a, 1).unwrap();
    assert_eq!(m.sent, n);
}
