//! The IBTA port states a PortInfo carries (vol. 1, 14.2.5.6: PortState
//! and PortPhysicalState) and the state changes an SM may ask for; the link
//! training between them is not modelled.
//!
//! Both ends of a cable use them: an HCA's ports and the fabric's own nodes
//! (switches, host nodes). What a cable carries, InfiniBand packets or
//! Ethernet frames, is its [`LinkLayer`].

/// What a cable carries: InfiniBand packets (LRH first) or Ethernet frames
/// (destination MAC first, the FCS last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub enum LinkLayer {
    /// InfiniBand.
    #[default]
    Ib,
    /// Ethernet.
    Eth,
}

impl LinkLayer {
    /// `ib` or `eth`.
    pub fn parse(s: &str) -> Option<LinkLayer> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ib" | "infiniband" => Some(LinkLayer::Ib),
            "eth" | "ethernet" => Some(LinkLayer::Eth),
            _ => None,
        }
    }
    /// The word [`LinkLayer::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            LinkLayer::Ib => "ib",
            LinkLayer::Eth => "eth",
        }
    }
}

/// PortInfo PortPhysicalState.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PhysicalState {
    /// Sleep.
    Sleep = 1,
    /// Polling (no partner).
    Polling = 2,
    /// Disabled.
    Disabled = 3,
    /// Port configuration training.
    Training = 4,
    /// Link up.
    LinkUp = 5,
    /// Link error recovery.
    LinkErrorRecovery = 6,
}

/// PortInfo PortState.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogicalState {
    /// Down.
    Down = 1,
    /// Initialize: link up, not configured by the SM.
    Init = 2,
    /// Armed.
    Armed = 3,
    /// Active.
    Active = 4,
}

impl LogicalState {
    /// From the PortInfo encoding.
    pub fn from_u8(v: u8) -> Option<LogicalState> {
        Some(match v {
            1 => LogicalState::Down,
            2 => LogicalState::Init,
            3 => LogicalState::Armed,
            4 => LogicalState::Active,
            _ => return None,
        })
    }

    /// The state a SubnSet(PortInfo) PortState of `req` asks of a port in
    /// state `self`: `Some(None)` keeps it (0), Down for 1, Armed for 3
    /// from Init or Armed, Active for 4 from Armed or Active; `None` for
    /// any other request (the SMA answers "invalid field" and changes
    /// nothing).
    pub fn set_by_sm(self, req: u8) -> Option<Option<LogicalState>> {
        use LogicalState::*;
        Some(match req {
            0 => None,
            1 => Some(Down),
            3 if matches!(self, Init | Armed) => Some(Armed),
            4 if matches!(self, Armed | Active) => Some(Active),
            _ => return None,
        })
    }
}
