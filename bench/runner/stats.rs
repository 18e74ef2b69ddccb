//! Order statistics over repetitions and the number formats of the tables.
//!
//! Every figure in a table is the median over repetitions; when there are several, the cell also
//! shows "(min–max)". Medians of an even count are the mean of the two middle values. Pure and
//! unit-tested: the tables' arithmetic lives here and nowhere else.

/// Median, minimum and maximum of a non-empty set of values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub count: usize,
}

impl Spread {
    /// `None` for no values. NaN sorts last (total order) and so never hides a real minimum.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Spread { median, min: v[0], max: v[n - 1], count: n })
    }

    /// "median" with two decimals, followed by " (min–max)" when there are several values.
    pub fn cell(&self) -> String {
        format!("{:.2}{}", self.median, self.range_suffix())
    }

    /// " (min–max)" with two decimals when there are several values, else nothing.
    pub fn range_suffix(&self) -> String {
        if self.count < 2 {
            String::new()
        } else {
            format!(" ({:.2}–{:.2})", self.min, self.max)
        }
    }
}

/// The median of the values, or `None` for none.
pub fn median(values: &[f64]) -> Option<f64> {
    Spread::of(values).map(|s| s.median)
}

/// A rate rounded to a whole number with thousands separators: 12345.6 → "12,346".
pub fn commas(x: f64) -> String {
    let s = format!("{:.0}", x);
    let (sign, digits) = match s.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", s.as_str()),
    };
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// `num / den` when both are known and `den` is positive.
pub fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// "12 s" below a minute, "3 min 5 s" from there on.
pub fn human_secs(s: u64) -> String {
    if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_count_is_the_middle_value() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.count), (2.0, 1.0, 3.0, 3));
    }

    #[test]
    fn median_of_even_count_is_the_mean_of_the_middle_two() {
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert_eq!(median(&[1.0, 2.0]), Some(1.5));
    }

    #[test]
    fn no_values_have_no_median() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn one_value_has_no_range_in_its_cell() {
        assert_eq!(Spread::of(&[1.234]).unwrap().cell(), "1.23");
        assert_eq!(Spread::of(&[1.0, 2.0, 4.0]).unwrap().cell(), "2.00 (1.00–4.00)");
    }

    #[test]
    fn commas_group_thousands() {
        assert_eq!(commas(0.4), "0");
        assert_eq!(commas(999.0), "999");
        assert_eq!(commas(1000.0), "1,000");
        assert_eq!(commas(1234567.5), "1,234,568");
        assert_eq!(commas(-12345.0), "-12,345");
    }

    #[test]
    fn ratio_needs_a_positive_denominator() {
        assert_eq!(ratio(Some(1.0), Some(2.0)), Some(0.5));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
    }

    #[test]
    fn human_secs_switches_to_minutes_at_sixty() {
        assert_eq!(human_secs(59), "59 s");
        assert_eq!(human_secs(60), "1 min 0 s");
        assert_eq!(human_secs(185), "3 min 5 s");
    }
}
