//! Routing: the (token, slot) rows of a call grouped by the expert `ids` sends them to.

use super::desc::Problem;
use super::{try_vec, Error, ErrorKind};

/// One routed row: `slot` of `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub token: u32,
    pub slot: u32,
}

/// The rows of one used expert: `Routing::rows[start..start + len]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub expert: usize,
    pub start: usize,
    pub len: usize,
}

/// Rows grouped by expert. Groups come largest first (ties by expert id), so handing them out in
/// order starts the longest work first; rows within a group are in (token, slot) order. Both orders
/// are fixed, so results do not depend on thread timing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing {
    pub rows: Vec<Row>,
    pub groups: Vec<Group>,
}

impl Routing {
    /// Groups the rows of `p` by the ids in `ids` (i32 elements, strides from `p`). Every id is
    /// checked before anything is built: an id outside `[0, n_expert)` is an error.
    pub fn new(p: &Problem, ids: &[i32]) -> Result<Routing, Error> {
        let mut counts = try_vec(p.n_expert, 0usize, "routing counts")?;
        for token in 0..p.n_tokens {
            for slot in 0..p.n_used {
                let id = ids[p.ids_offset(token, slot)];
                match usize::try_from(id).ok().filter(|&e| e < p.n_expert) {
                    Some(e) => counts[e] += 1,
                    None => {
                        return Err(Error::new(
                            ErrorKind::InvalidArgument,
                            format!("ids[{slot}, {token}] = {id} is outside [0, {})", p.n_expert),
                        ))
                    }
                }
            }
        }
        let mut next = try_vec(p.n_expert, 0usize, "routing offsets")?;
        let mut start = 0;
        for (e, &c) in counts.iter().enumerate() {
            next[e] = start;
            start += c;
        }
        let mut groups: Vec<Group> = (0..p.n_expert)
            .filter(|&e| counts[e] > 0)
            .map(|e| Group {
                expert: e,
                start: next[e],
                len: counts[e],
            })
            .collect();
        let mut rows = try_vec(p.rows(), Row { token: 0, slot: 0 }, "routed rows")?;
        for token in 0..p.n_tokens {
            for slot in 0..p.n_used {
                let e = ids[p.ids_offset(token, slot)] as usize;
                rows[next[e]] = Row {
                    token: token as u32,
                    slot: slot as u32,
                };
                next[e] += 1;
            }
        }
        groups.sort_by(|a, b| b.len.cmp(&a.len).then(a.expert.cmp(&b.expert)));
        Ok(Routing { rows, groups })
    }

    /// The rows of `g`.
    pub fn rows_of(&self, g: &Group) -> &[Row] {
        &self.rows[g.start..g.start + g.len]
    }
}

#[cfg(test)]
mod tests {
    use super::super::desc::{validate, TensorDesc, GGML_TYPE_I32};
    use super::*;

    fn problem(n_expert: i64, n_used: i64, n_tokens: i64, ids_nb1: usize) -> Problem {
        let (k, n) = (64i64, 32i64);
        let w = TensorDesc {
            ty: 2,
            ne: [k, n, n_expert, 1],
            nb: [18, 36, 36 * 32, 0],
            addr: 0x10_0000,
            name: None,
        };
        let b = TensorDesc {
            ty: 0,
            ne: [k, 1, n_tokens, 1],
            nb: [4, 256, 256, 0],
            addr: 0x20_0000,
            name: None,
        };
        let ids = TensorDesc {
            ty: GGML_TYPE_I32,
            ne: [n_used, n_tokens, 1, 1],
            nb: [4, ids_nb1, 0, 0],
            addr: 0x30_0000,
            name: None,
        };
        let nbd = [4, 128, 128 * n_used as usize, 0];
        let dst = TensorDesc {
            ty: 0,
            ne: [n, n_used, n_tokens, 1],
            nb: nbd,
            addr: 0x40_0000,
            name: None,
        };
        validate(&w, &b, &ids, &dst).unwrap()
    }

    #[test]
    fn groups_largest_first_with_strided_ids() {
        // ids is a view: 3 used slots of rows 4 ints apart; the 4th int of each row is junk.
        let p = problem(5, 3, 3, 16);
        let ids = [4, 1, 4, 99, 4, 0, 1, -7, 2, 4, 1, 55];
        let r = Routing::new(&p, &ids).unwrap();
        let got: Vec<(usize, Vec<(u32, u32)>)> = r
            .groups
            .iter()
            .map(|g| {
                (
                    g.expert,
                    r.rows_of(g).iter().map(|x| (x.token, x.slot)).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (4, vec![(0, 0), (0, 2), (1, 0), (2, 1)]),
                (1, vec![(0, 1), (1, 2), (2, 2)]),
                (0, vec![(1, 1)]),
                (2, vec![(2, 0)]),
            ]
        );
    }

    #[test]
    fn out_of_range_ids_are_errors() {
        let p = problem(4, 2, 2, 8);
        for bad in [-1, 4, i32::MIN, i32::MAX] {
            let err = Routing::new(&p, &[0, 1, 2, bad]).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            assert!(err.message().contains("ids[1, 1]"), "{err}");
        }
    }
}
