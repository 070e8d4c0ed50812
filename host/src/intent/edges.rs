//! Directed edges between an intent's resources, by index, kept flat: one vector of targets and
//! one of where each resource's targets start. A version of 100,000 resources holds several such
//! graphs (what each requires, what it waits for, what it blocks); as vectors of vectors each
//! cost 24 bytes a resource even with no edge at all, flat they cost 8 and one allocation.

/// Edges by source: [`Edges::of`] lists, in the order they were given, where a resource's
/// edges lead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edges {
    /// `targets[starts[i]..starts[i + 1]]` are the edges of `i`; `starts` has one entry more
    /// than there are resources.
    starts: Vec<usize>,
    targets: Vec<usize>,
}

impl Edges {
    /// The edges `(from, to)` among `n` resources (every index below `n`), each source's
    /// edges kept in the order given.
    pub fn from_pairs(n: usize, pairs: &[(usize, usize)]) -> Edges {
        let mut starts = vec![0usize; n + 1];
        for &(from, _) in pairs {
            starts[from + 1] += 1;
        }
        for i in 0..n {
            starts[i + 1] += starts[i];
        }
        let mut next = starts.clone();
        let mut targets = vec![0usize; pairs.len()];
        for &(from, to) in pairs {
            targets[next[from]] = to;
            next[from] += 1;
        }
        Edges { starts, targets }
    }

    /// Where the edges of `i` lead.
    pub fn of(&self, i: usize) -> &[usize] {
        &self.targets[self.starts[i]..self.starts[i + 1]]
    }

    /// How many resources the edges are among.
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every edge as `(from, to)`, by source, in order.
    pub fn pairs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.len()).flat_map(move |i| self.of(i).iter().map(move |&j| (i, j)))
    }

    /// The same edges pointing the other way.
    pub fn reversed(&self) -> Edges {
        let pairs: Vec<(usize, usize)> = self.pairs().map(|(i, j)| (j, i)).collect();
        Edges::from_pairs(self.len(), &pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_keep_their_order_by_source_and_reverse() {
        let e = Edges::from_pairs(4, &[(2, 0), (0, 3), (2, 1), (0, 1)]);
        assert_eq!(e.len(), 4);
        assert_eq!(e.of(0), [3, 1]);
        assert!(e.of(1).is_empty());
        assert_eq!(e.of(2), [0, 1]);
        assert!(e.of(3).is_empty());
        assert_eq!(e.pairs().collect::<Vec<_>>(), [(0, 3), (0, 1), (2, 0), (2, 1)]);
        let r = e.reversed();
        assert_eq!((r.of(0), r.of(1), r.of(2), r.of(3)), (&[2][..], &[0, 2][..], &[][..], &[0][..]));
        assert!(Edges::from_pairs(0, &[]).is_empty());
    }
}
