//! What a collective of each kind sends and gets, chunk by chunk:
//! [`Shape`] (its layout, input and output lengths), [`interleave_block`]
//! (how shards interleave) and [`Shape::n_chunks`].
//!
//! Invariants: an all-reduce of `len` elements is one shard; a
//! reduce-scatter or all-gather is n shards of m elements, shard r owned by
//! rank r (docs/PROTOCOL.md, "Collective kinds"); a broadcast is one shard
//! owned by its root. Every rank of a job has the same E, so every rank
//! cuts the same way.

use crate::wire::Kind;

/// What a collective does and where its chunks lie: an all-reduce of `len`
/// elements, a reduce-scatter or all-gather of n shards of m elements, or a
/// broadcast from one root (docs/PROTOCOL.md, "Collective kinds").
///
/// Offsets: [`Transmit::values`](crate::member::Transmit) index the caller's input and
/// [`ResultOutcome::Fresh::into`](crate::member::ResultOutcome::Fresh) its output, which
/// have these lengths ([`Shape::input_len`], [`Shape::output_len`]):
///
/// | kind | input | output |
/// |---|---|---|
/// | all-reduce | len | len (the same tensor) |
/// | reduce-scatter | n·m | m (the rank's shard of the sum) |
/// | all-gather | m (the rank's shard) | n·m (the caller copies its own shard) |
/// | broadcast | len at the root, else 0 | len at the others, else 0 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub(super) kind: Kind,
    pub(super) rank: u16,
    /// Shards in the layout: n for reduce-scatter and all-gather, else 1.
    pub(super) shards: u16,
    pub(super) shard_len: usize,
    /// A broadcast's root: the owner of every chunk.
    pub(super) root: Option<u16>,
    /// A reduce-scatter's owner keeps its shard: it sends NOVAL for its own
    /// chunks and adds its values to the other ranks' sum the RESULT
    /// brings ([`Kind::owner_may_keep_values`]).
    pub(super) owner_keeps: bool,
}

impl Shape {
    /// An all-reduce of `len` elements.
    pub const fn all_reduce(len: usize) -> Shape {
        Shape {
            kind: Kind::AllReduce,
            rank: 0,
            shards: 1,
            shard_len: len,
            root: None,
            owner_keeps: false,
        }
    }
    /// Rank `rank` of `n` reduce-scatters n shards of `shard_len`. The rank
    /// keeps its own shard (n > 1): its output is the other ranks'
    /// rank-order sum plus its own values (docs/PROTOCOL.md, "Collective
    /// kinds"), and its link carries (n−1)/n of the input.
    pub const fn reduce_scatter(rank: u16, n: u16, shard_len: usize) -> Shape {
        Shape {
            kind: Kind::ReduceScatter,
            rank,
            shards: n,
            shard_len,
            root: None,
            owner_keeps: n > 1,
        }
    }
    /// This reduce-scatter with the rank sending its own shard too: the
    /// switch then sums every rank in rank order (the bits of an
    /// all-reduce), and sees every rank's gradient (a `stats = true` job
    /// needs that). Other shapes are returned unchanged.
    pub const fn sending_own_shard(mut self) -> Shape {
        self.owner_keeps = false;
        self
    }
    /// Whether this rank keeps its shard ([`Shape::reduce_scatter`]).
    pub const fn owner_keeps(&self) -> bool {
        self.owner_keeps
    }
    /// Rank `rank` of `n` all-gathers shards of `shard_len`.
    pub const fn all_gather(rank: u16, n: u16, shard_len: usize) -> Shape {
        Shape {
            kind: Kind::AllGather,
            rank,
            shards: n,
            shard_len,
            root: None,
            owner_keeps: false,
        }
    }
    /// Rank `rank` takes part in a broadcast of `len` elements from `root`:
    /// an all-gather whose every chunk `root` owns.
    pub const fn broadcast(rank: u16, root: u16, len: usize) -> Shape {
        Shape {
            kind: Kind::AllGather,
            rank,
            shards: 1,
            shard_len: len,
            root: Some(root),
            owner_keeps: false,
        }
    }
    pub const fn kind(&self) -> Kind {
        self.kind
    }
    /// Elements of the layout the chunks cover (n·m, or len).
    pub const fn layout_len(&self) -> usize {
        self.shards as usize * self.shard_len
    }
    /// Whether this is a broadcast (an all-gather with one owner).
    pub const fn root(&self) -> Option<u16> {
        self.root
    }
    /// Elements the caller's input holds.
    pub const fn input_len(&self) -> usize {
        match (self.kind, self.root) {
            (Kind::AllGather, None) => self.shard_len,
            (Kind::AllGather, Some(root)) if root != self.rank => 0,
            _ => self.layout_len(),
        }
    }
    /// Elements the caller's output holds.
    pub const fn output_len(&self) -> usize {
        match (self.kind, self.root) {
            (Kind::ReduceScatter, _) => self.shard_len,
            (Kind::AllGather, Some(root)) if root == self.rank => 0,
            _ => self.layout_len(),
        }
    }
    /// Chunks of `elems_per_chunk` in the whole collective.
    pub fn n_chunks(&self, elems_per_chunk: u16) -> usize {
        self.shards as usize * self.shard_len.div_ceil((elems_per_chunk as usize).max(1))
    }
}

/// Chunks of one shard in a row when a reduce-scatter's or all-gather's
/// shards interleave (docs/PROTOCOL.md, "Collective kinds"): about 4096
/// elements (16 KB of float32), at least one chunk. Every rank of a job
/// has the same E, so every rank cuts the same way.
pub fn interleave_block(elems_per_chunk: usize) -> usize {
    (4096 / elems_per_chunk.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_give_input_and_output_lengths() {
        let rs = Shape::reduce_scatter(2, 4, 10);
        assert_eq!(
            (rs.input_len(), rs.output_len(), rs.layout_len()),
            (40, 10, 40)
        );
        let ag = Shape::all_gather(2, 4, 10);
        assert_eq!(
            (ag.input_len(), ag.output_len(), ag.layout_len()),
            (10, 40, 40)
        );
        let ar = Shape::all_reduce(10);
        assert_eq!((ar.input_len(), ar.output_len()), (10, 10));
        let root = Shape::broadcast(1, 1, 10);
        let leaf = Shape::broadcast(0, 1, 10);
        assert_eq!((root.input_len(), root.output_len()), (10, 0));
        assert_eq!((leaf.input_len(), leaf.output_len()), (0, 10));
        assert_eq!(rs.n_chunks(3), 16);
    }
}
