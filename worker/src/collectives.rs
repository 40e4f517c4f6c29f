//! The public collective calls: all-reduce, reduce-scatter, all-gather
//! (of elements or of raw bytes) and broadcast, their checks (dtype,
//! lengths, root), and `run_shape`, which every one of them runs.
//!
//! Owns: the inputs a re-join may need, kept as wire bytes: the current
//! collective's and the last completed one's (docs/PROTOCOL.md,
//! "Sessions"), and the last collective's outcome (next seq and
//! collective, gradient statistics). Invariants: a failed collective is
//! nobody's previous one; after a failed collective of an `auth = "mac"`
//! job this worker sends no more DATA (a new join must).

use proto::member::{Member, Shape};
use proto::stats::GradStats;
use proto::tag::AuthMode;
use proto::wire::Kind;

use crate::buffers::{Input, Output};
use crate::stats::Grad;
use crate::{Element, Worker, WorkerError};

impl Worker {
    /// Sums `data` element-wise across every rank of the job, in place.
    /// Every rank calls it with a tensor of the same length; the result is
    /// the rank-order sum, bit-identical on every rank (for bf16 and f16,
    /// summed in float32 and rounded once by the switch). `T` must be the
    /// dtype the worker joined with.
    pub fn all_reduce<T: Element>(&mut self, data: &mut [T]) -> Result<(), WorkerError> {
        self.check_dtype::<T>("all_reduce")?;
        let shape = Shape::all_reduce(data.len());
        self.run_shape(shape, None, bytemuck::cast_slice_mut(data))
    }

    /// Reduce-scatter: `input` holds n shards of m elements (n the job's
    /// ranks), shard r for rank r; `output` (m elements) gets this rank's
    /// shard of the element-wise sum over every rank. This rank's own shard
    /// never leaves it (its link carries (n−1)/n of the input): the switch
    /// sums the other ranks in rank order and this rank adds its own last,
    /// rounding once more in bf16/f16 (docs/PROTOCOL.md, "Collective
    /// kinds"), so the bits are reproducible but not those of
    /// [`Worker::all_reduce`]; a `stats = true` job sends every shard and
    /// gets the all-reduce's bits. Only the sum: an
    /// average (FSDP's default) is the caller's division by n, after this
    /// returns (aggswitch.torch divides), so every rank divides the same
    /// bits the same way. Every rank calls it with the same lengths.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), WorkerError> {
        self.check_dtype::<T>("reduce_scatter")?;
        let n = self.cfg.n_workers;
        if input.len() != output.len().saturating_mul(n.into()) {
            return Err(self.wrong_length("reduce_scatter", input.len(), output.len()));
        }
        self.run_shape(
            self.reduce_scatter_shape(output.len()),
            Some(bytemuck::cast_slice(input)),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// This rank's part in a reduce-scatter into shards of `m` elements:
    /// it keeps its own shard ([`Shape::owner_keeps`]) unless the job is
    /// `stats = true`, whose statistics need every rank's gradient at the
    /// switch.
    pub fn reduce_scatter_shape(&self, m: usize) -> Shape {
        let shape = Shape::reduce_scatter(self.cfg.rank, self.cfg.n_workers, m);
        if self.member.session().grad_stats() {
            shape.sending_own_shard()
        } else {
            shape
        }
    }

    /// All-gather: `output` (n·m elements) gets every rank's `input` (m
    /// elements), rank r's at `r·m`, bit for bit (the switch copies whole
    /// elements of the job's size, never converting them). This rank's own
    /// shard is copied locally. Every rank calls it with the same lengths.
    pub fn all_gather<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), WorkerError> {
        self.check_dtype::<T>("all_gather")?;
        let n = self.cfg.n_workers;
        if output.len() != input.len().saturating_mul(n.into()) {
            return Err(self.wrong_length("all_gather", input.len(), output.len()));
        }
        self.gather(
            input.len(),
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// [`Worker::all_gather`] of raw bytes: the switch copies elements of
    /// the job's size without looking at them, so any data whose length is
    /// a whole number of them can be gathered, e.g. float32 parameters
    /// through a bf16 job (FSDP's mixed precision: parameters gathered in
    /// their own dtype, gradients reduced in the job's). `input` is this
    /// rank's shard, `output` n times its length.
    pub fn all_gather_bytes(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), WorkerError> {
        let size = self.cfg.dtype.size();
        if !input.len().is_multiple_of(size) {
            return Err(WorkerError::NotWholeElements {
                job: self.cfg.job,
                rank: self.cfg.rank,
                bytes: input.len(),
                dtype: self.cfg.dtype,
            });
        }
        if output.len() != input.len().saturating_mul(self.cfg.n_workers.into()) {
            return Err(self.wrong_length("all_gather_bytes", input.len(), output.len()));
        }
        self.gather(input.len() / size, input, output)
    }

    /// All-gather of shards of `m` elements given as wire bytes, lengths
    /// already checked.
    fn gather(&mut self, m: usize, input: &[u8], output: &mut [u8]) -> Result<(), WorkerError> {
        let own = usize::from(self.cfg.rank) * input.len();
        output[own..own + input.len()].copy_from_slice(input);
        let shape = Shape::all_gather(self.cfg.rank, self.cfg.n_workers, m);
        self.run_shape(shape, Some(input), output)
    }

    /// Broadcast: every rank's `data` becomes `root`'s, bit for bit (an
    /// all-gather whose every chunk `root` owns). Every rank calls it with
    /// the same root and length.
    pub fn broadcast<T: Element>(&mut self, root: u16, data: &mut [T]) -> Result<(), WorkerError> {
        self.check_dtype::<T>("broadcast")?;
        if root >= self.cfg.n_workers {
            return Err(WorkerError::BadRoot {
                job: self.cfg.job,
                rank: self.cfg.rank,
                root,
                n: self.cfg.n_workers,
            });
        }
        let shape = Shape::broadcast(self.cfg.rank, root, data.len());
        let data: &mut [u8] = bytemuck::cast_slice_mut(data);
        if root == self.cfg.rank {
            // The root's tensor is only read: it is the input, and its
            // output is empty.
            return self.run_shape(shape, Some(data), &mut []);
        }
        self.run_shape(shape, Some(&[]), data)
    }

    fn check_dtype<T: Element>(&self, call: &'static str) -> Result<(), WorkerError> {
        if T::DTYPE != self.cfg.dtype {
            return Err(WorkerError::WrongDtype {
                job: self.cfg.job,
                rank: self.cfg.rank,
                call,
                tensor: T::DTYPE,
                joined: self.cfg.dtype,
            });
        }
        Ok(())
    }

    fn wrong_length(&self, call: &'static str, input: usize, output: usize) -> WorkerError {
        WorkerError::WrongLength {
            job: self.cfg.job,
            rank: self.cfg.rank,
            call,
            input,
            output,
            n: self.cfg.n_workers,
        }
    }

    /// Runs one collective of `shape` over wire bytes: `input` (None: the
    /// output is also the input, as in an all-reduce) is kept for resends,
    /// RESULT values are copied into `out`.
    fn run_shape(
        &mut self,
        shape: Shape,
        input: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), WorkerError> {
        let len = shape.layout_len();
        let max = (self.member.elems_per_chunk() as usize) * (i32::MAX as usize);
        if len > max {
            return Err(WorkerError::TensorTooLong { len, max });
        }
        if let Some(e) = self.failed {
            return Err(self.session_failed(e));
        }
        if self.data_key_spent {
            return Err(WorkerError::MacNeedsNewJoin {
                job: self.cfg.job,
                rank: self.cfg.rank,
            });
        }
        let collective = self.next_collective;
        let first_seq = self.next_seq;
        let values_len = input.map_or(out.len(), <[u8]>::len);
        // The two kept inputs swap each collective. When they must grow,
        // both grow now (the previous input keeps its bytes), their pages
        // touched here, so the next collective, which writes the other
        // one, faults in none of them: steady state after one collective.
        self.prev_input.reserve(values_len);
        let mut kept = std::mem::take(&mut self.input);
        let elems = usize::from(self.member.elems_per_chunk().max(1));
        let chunks = len.div_ceil(elems);
        match input {
            Some(values) => kept.copy_from(values),
            // In place (an all-reduce): kept chunk by chunk as the threads
            // send (buffers.rs); only its length is set here.
            None => {
                kept.set_len(values_len);
            }
        }
        let mut bits = std::mem::take(&mut self.kept_bits);
        bits.reset(chunks);
        self.set_shares(self.threads_for(chunks as u32));
        self.begin_all(collective, first_seq, shape);
        self.last_grad = None;
        let cur = (collective, first_seq, shape);
        let result = self
            .rejoin_if_due(collective, first_seq)
            .and_then(|resume| match input {
                Some(_) => self.run_collective(
                    cur,
                    resume,
                    Input::Whole(kept.bytes()),
                    Some(Output::new(out)),
                ),
                None => {
                    let chunk_bytes = elems * self.cfg.dtype.size();
                    let (input, out) = Input::in_place(out, kept.bytes_mut(), chunk_bytes, &bits);
                    let r = self.run_collective(cur, resume, input, Some(out));
                    // Also after a failure: a host path redoes the
                    // collective from it (`last_input`).
                    input.finish();
                    r
                }
            });
        self.kept_bits = bits;
        self.last_failed = result.is_err();
        if result.is_ok() {
            // Keep this input as the previous one: another rank may still
            // need this collective's chunks after a restart.
            self.input = std::mem::replace(&mut self.prev_input, kept);
        } else {
            // A collective that failed is nobody's previous one: the last
            // completed collective's input (`prev_collective` names it)
            // stays for a catch-up, or a catch-up would send these values
            // under its seqs. This one stays for `last_input`.
            self.input = kept;
        }
        if result.is_err() && self.auth() == AuthMode::Mac {
            // The next call would tag other data under the same (seq,
            // collective) and key: a GMAC nonce used twice gives its key
            // away. Only a new join (a new DATA key) may send again.
            self.data_key_spent = true;
        }
        result?;
        let cur = self.member.collective();
        let grad = match (self.member.session().grad_stats(), shape.kind()) {
            (false, _) | (true, Kind::AllGather) => Grad::NotSummed,
            // An empty collective has no chunk to carry a trailer: it sums
            // nothing.
            (true, _) if cur.n_chunks() == 0 => Grad::Whole(GradStats {
                ranks: self.cfg.n_workers.into(),
                ..GradStats::default()
            }),
            (true, _) => {
                let shares = std::iter::once(&self.member)
                    .chain(self.lanes[..self.active - 1].iter().map(|l| &l.member));
                // Every chunk has its RESULT, and every RESULT of a stats
                // session its trailer (the old shares' moved to the new
                // ones when the threads changed): one is missing only if
                // it came before the job became stats = true.
                Member::grad_stats_of_shares(&shares.collect::<Vec<_>>())
                    .map_or(Grad::Incomplete, Grad::Whole)
            }
        };
        self.last_grad = Some((collective, grad));
        self.prev_first_seq = first_seq;
        self.prev_collective = Some(collective);
        self.prev_shape = shape;
        self.next_seq = cur.end_seq();
        self.next_collective = collective.wrapping_add(1);
        self.stats.collectives += 1;
        Ok(())
    }
}
