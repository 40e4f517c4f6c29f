//! Where a worker sits in an aggregation tree (`--tree-leaves`,
//! `--leaf`): the two flags checked against `--rank` and `--workers`, and
//! the global rank whose pattern the worker sends.
//!
//! A [`TreePlace`] names a leaf and a local rank that the tree has, and
//! `--workers` is that leaf's size: each error says which of the flags is
//! wrong.

use anyhow::{bail, Context, Result};
use proto::reference::tree_global_rank;

/// Where a worker sits in an aggregation tree (`--tree-leaves`, `--leaf`).
#[derive(Debug, PartialEq)]
pub(crate) struct TreePlace {
    /// Workers per leaf, in leaf order.
    pub(crate) sizes: Vec<u16>,
    pub(crate) leaf: usize,
    /// The earlier leaves' sizes plus the local rank.
    pub(crate) global_rank: u16,
}

/// Checks `--tree-leaves` and `--leaf` (both or neither) against the local
/// `--rank` and `--workers`; `None` without them.
pub(crate) fn tree_place(
    sizes: Option<&[u16]>,
    leaf: Option<usize>,
    rank: u16,
    workers: u16,
) -> Result<Option<TreePlace>> {
    let (sizes, leaf) = match (sizes, leaf) {
        (None, None) => return Ok(None),
        (Some(_), None) => bail!("--tree-leaves needs --leaf (this worker's leaf, from 0)"),
        (None, Some(_)) => bail!("--leaf needs --tree-leaves (workers per leaf, in leaf order)"),
        (Some(s), Some(l)) => (s, l),
    };
    let list = sizes
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let global_rank = tree_global_rank(sizes, leaf, rank)
        .with_context(|| format!("--tree-leaves {list} --leaf {leaf} --rank {rank}"))?;
    if workers != sizes[leaf] {
        bail!(
            "--workers {workers} is not the size of leaf {leaf} in --tree-leaves {list} ({}): \
             --workers is the number of ranks of this worker's leaf",
            sizes[leaf]
        );
    }
    Ok(Some(TreePlace {
        sizes: sizes.to_vec(),
        leaf,
        global_rank,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{allreduce_args, AllreduceArgs};

    fn place_of(a: &AllreduceArgs) -> Result<Option<TreePlace>> {
        tree_place(
            a.tree_leaves.as_deref(),
            a.leaf,
            a.job.rank,
            a.job.target.workers,
        )
    }

    #[test]
    fn without_the_tree_options_nothing_changes() {
        let a = allreduce_args(&["--verify"]).unwrap();
        assert_eq!((a.tree_leaves.as_ref(), a.leaf), (None, None));
        assert_eq!(place_of(&a).unwrap(), None);
    }

    #[test]
    fn tree_leaves_parse_as_a_comma_list_and_map_to_the_global_rank() {
        // Rank 1 of leaf 1 of leaves 2, 3, 1: global rank 2 + 1.
        let a = allreduce_args(&["--tree-leaves", "2,3,1", "--leaf", "1"]).unwrap();
        assert_eq!(a.tree_leaves.as_deref(), Some(&[2u16, 3, 1][..]));
        assert_eq!(
            place_of(&a).unwrap(),
            Some(TreePlace {
                sizes: vec![2, 3, 1],
                leaf: 1,
                global_rank: 3
            })
        );
        // Leaf 0: the global rank is the local rank.
        let p = tree_place(Some(&[3, 3]), Some(0), 2, 3).unwrap().unwrap();
        assert_eq!(p.global_rank, 2);
        let p = tree_place(Some(&[3, 3]), Some(1), 2, 3).unwrap().unwrap();
        assert_eq!(p.global_rank, 5);
    }

    #[test]
    fn tree_leaves_that_are_not_numbers_are_refused_by_the_parser() {
        for bad in ["2,x", "2,70000", "-1"] {
            assert!(
                allreduce_args(&["--tree-leaves", bad, "--leaf", "0"]).is_err(),
                "{bad}"
            );
        }
    }

    fn err(sizes: Option<&[u16]>, leaf: Option<usize>, rank: u16, workers: u16) -> String {
        format!("{:#}", tree_place(sizes, leaf, rank, workers).unwrap_err())
    }

    #[test]
    fn bad_tree_options_say_what_is_wrong() {
        assert_eq!(
            err(Some(&[2, 2]), None, 0, 2),
            "--tree-leaves needs --leaf (this worker's leaf, from 0)"
        );
        assert_eq!(
            err(None, Some(0), 0, 2),
            "--leaf needs --tree-leaves (workers per leaf, in leaf order)"
        );
        assert_eq!(
            err(Some(&[2, 2]), Some(2), 0, 2),
            "--tree-leaves 2,2 --leaf 2 --rank 0: there is no leaf 2: the tree has 2 leaves, numbered from 0"
        );
        assert_eq!(
            err(Some(&[2, 3]), Some(0), 2, 3),
            "--tree-leaves 2,3 --leaf 0 --rank 2: there is no local rank 2 in leaf 0: it has 2 workers, ranks 0 to 1"
        );
        assert_eq!(
            err(Some(&[65535, 1]), Some(1), 0, 1),
            "--tree-leaves 65535,1 --leaf 1 --rank 0: the leaves have 65536 workers in all, more than 65535 (global ranks are 16 bits)"
        );
        assert_eq!(
            err(Some(&[2, 0]), Some(0), 0, 2),
            "--tree-leaves 2,0 --leaf 0 --rank 0: leaf 1 has no workers (every leaf needs at least one)"
        );
        assert_eq!(
            err(Some(&[2, 3]), Some(1), 1, 2),
            "--workers 2 is not the size of leaf 1 in --tree-leaves 2,3 (3): \
             --workers is the number of ranks of this worker's leaf"
        );
        // The largest tree there may be is accepted.
        let p = tree_place(Some(&[65534, 1]), Some(1), 0, 1)
            .unwrap()
            .unwrap();
        assert_eq!(p.global_rank, 65534);
    }
}
