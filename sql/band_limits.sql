-- band_limits(t) -> (last_early, first_late): among anchors 0..t, the last one decision_band calls early and the
-- first one it calls late (NULL where none is): the bands a report shades and its captions name.
CREATE OR REPLACE MACRO band_limits(t) AS TABLE
SELECT max(a) FILTER (WHERE decision_band(a, t) = 'early') AS last_early,
       min(a) FILTER (WHERE decision_band(a, t) = 'late') AS first_late
FROM range(t + 1) anchors(a);
