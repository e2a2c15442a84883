//! Where a page lives on the memory nodes: page `p`'s copy `j` (0 the
//! primary) is on node `(p + j) mod n`, in slot `(p / n) * r + j` of that
//! node's chunk (`n` nodes, `r` copies of every page).
//!
//! So consecutive pages go round the nodes (a sequential scan reads from
//! all of them), a page's copies are on `r` different nodes, and each node
//! holds `ceil(pages / n) * r` pages: with two nodes and two copies, each
//! holds the whole region.

use crate::PAGE_SIZE;

/// The placement rule for `nodes` memory nodes and `replicas` copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    nodes: usize,
    replicas: usize,
}

impl Placement {
    /// `None` unless `1 <= replicas <= nodes`.
    pub fn new(nodes: usize, replicas: usize) -> Option<Placement> {
        (replicas >= 1 && replicas <= nodes).then_some(Placement { nodes, replicas })
    }

    /// Memory nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Copies of every page.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Copy `j` (below [`Placement::replicas`]) of `page`: its node and
    /// its byte offset in that node's chunk.
    pub fn copy(&self, page: u64, j: usize) -> (usize, u64) {
        let n = self.nodes as u64;
        let node = ((page % n) + j as u64) % n;
        let slot = (page / n) * self.replicas as u64 + j as u64;
        (node as usize, slot * PAGE_SIZE as u64)
    }

    /// Bytes each node's chunk needs for a region of `pages` pages.
    pub fn chunk_len(&self, pages: u64) -> u64 {
        pages.div_ceil(self.nodes as u64) * self.replicas as u64 * PAGE_SIZE as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn copies_are_on_distinct_nodes_and_never_share_a_slot() {
        for nodes in 1..=4 {
            for replicas in 1..=nodes {
                let p = Placement::new(nodes, replicas).unwrap();
                let pages = 37u64;
                let mut used = HashSet::new();
                for page in 0..pages {
                    let mut on = HashSet::new();
                    for j in 0..replicas {
                        let (node, off) = p.copy(page, j);
                        assert!(node < nodes);
                        assert!(
                            off + PAGE_SIZE as u64 <= p.chunk_len(pages),
                            "{nodes} {replicas} {page} {j}"
                        );
                        assert!(off.is_multiple_of(PAGE_SIZE as u64));
                        assert!(on.insert(node), "two copies of {page} on node {node}");
                        assert!(
                            used.insert((node, off)),
                            "slot {off:#x} of node {node} twice"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn pages_go_round_the_nodes() {
        let p = Placement::new(2, 1).unwrap();
        assert_eq!(p.copy(0, 0), (0, 0));
        assert_eq!(p.copy(1, 0), (1, 0));
        assert_eq!(p.copy(2, 0), (0, 4096));
        let p = Placement::new(2, 2).unwrap();
        assert_eq!(p.copy(1, 1), (0, 4096));
        assert_eq!(
            p.chunk_len(10),
            10 * 4096,
            "two nodes, two copies: each holds all"
        );
        assert_eq!(Placement::new(1, 2), None);
        assert_eq!(Placement::new(2, 0), None);
    }
}
