-- robust_sweep(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0, seeds := false) -> per model, view, k and
-- run of the set (robust_bands): n, mean l*(k), f_early, f_mid, f_late, never_stable on the images every member
-- counts, its family, votes (its family's vote is this run's) and family_holds (the share whose band is the same
-- under every member of its family; NULL for a family of one run); for the set, equal on its rows: probes (runs),
-- families, probe_set (the runs that vote, one per family), band_holds and layer_holds (the share whose band, layer,
-- is the same under every voter), band_holds_chance (the share that voters with their own band shares, drawn
-- independently, would all agree on), kappa (Fleiss' kappa of the voters' bands: 0 = agreement at chance, 1 =
-- complete; NULL with fewer than two families), each fraction's range over the set (<fraction>_min, _max), and
-- late_is_never_stable (at this k no stable l*(k) is late, so f_late is the never-stable share). Intervals:
-- analytics/robustness.py.
CREATE OR REPLACE MACRO robust_sweep(kmax := 4, scope := 'auto', run_set := NULL, min_conf := 0, seeds := false) AS TABLE
WITH b AS (SELECT * FROM robust_bands(kmax := kmax, scope := scope, run_set := run_set, min_conf := min_conf,
                                      seeds := seeds)),
per_run AS (
    SELECT model, view, k, run_id, any_value(probe_id) AS probe_id, any_value(family) AS family,
           any_value(votes) AS votes, any_value(probes) AS probes, any_value(families) AS families,
           any_value(t) AS t, count(*) AS n, avg(layer) AS mean, avg((band = 'early')::INT) AS f_early,
           avg((band = 'mid')::INT) AS f_mid, avg((band = 'late')::INT) AS f_late,
           avg(never_stable::INT) AS never_stable, avg(band_holds::INT) AS band_holds,
           avg(layer_holds::INT) AS layer_holds, avg(family_holds::INT) AS family_holds
    FROM b GROUP BY model, view, k, run_id),
counts AS (  -- per image, how many voters put it in each band
    SELECT model, view, k, image_id, band, count(*) AS c FROM b WHERE votes GROUP BY ALL),
agreement AS (  -- Fleiss' kappa from integer sums (exact, so no thread count moves it): N images, m votes each,
               -- S = the sum of squared per-image band counts, E = the sum of squared per-band totals
    SELECT model, view, k, any_value(m) AS m, any_value(big_n) AS big_n, any_value(s) AS s, sum(total * total) AS e
    FROM (SELECT model, view, k, band, sum(c) AS total,
                 sum(sum(c * c)) OVER (PARTITION BY model, view, k) AS s
          FROM counts GROUP BY model, view, k, band) per_band
    JOIN (SELECT model, view, k, count(DISTINCT image_id) AS big_n, max(votes_) AS m
          FROM (SELECT model, view, k, image_id, sum(c) AS votes_ FROM counts GROUP BY ALL) GROUP BY ALL)
    USING (model, view, k)
    GROUP BY model, view, k),
fleiss AS (  -- P-bar = (S - N m) / (N m (m - 1)), P-e = E / (N m)^2, kappa = (P-bar - P-e) / (1 - P-e)
    SELECT model, view, k,
           CASE WHEN m > 1 AND e < (big_n * m) ** 2
                THEN ((s - big_n * m) / (big_n * m * (m - 1)) - e / (big_n * m) ** 2) / (1 - e / (big_n * m) ** 2)
           END AS kappa
    FROM agreement),
chance AS (  -- independent voters at their own band shares: the chance that all pick the same band
    SELECT model, view, k, list_sum(list(together ORDER BY band)) AS band_holds_chance
    FROM (SELECT model, view, k, band, list_reduce(list(share ORDER BY run_id), lambda a, b: a * b) AS together
          FROM (SELECT p.model, p.view, p.k, p.run_id, bands.band,
                       CASE bands.band WHEN 'early' THEN p.f_early WHEN 'mid' THEN p.f_mid ELSE p.f_late END AS share
                FROM per_run p, (VALUES ('early'), ('mid'), ('late')) bands(band) WHERE p.votes)
          GROUP BY ALL)
    GROUP BY ALL),
voters AS (
    SELECT model, view, k, list(run_id ORDER BY run_id) AS probe_set FROM per_run WHERE votes GROUP BY ALL)
SELECT p.model, p.view, p.k, p.run_id, p.probe_id, p.family, p.votes, p.n, p.mean, p.f_early, p.f_mid, p.f_late,
       p.never_stable, p.family_holds, p.probes, p.families, v.probe_set, p.band_holds, p.layer_holds,
       CASE WHEN p.families > 1 THEN c.band_holds_chance END AS band_holds_chance,
       CASE WHEN p.families > 1 THEN f.kappa END AS kappa,
       min(p.f_early) OVER w AS f_early_min, max(p.f_early) OVER w AS f_early_max,
       min(p.f_mid) OVER w AS f_mid_min, max(p.f_mid) OVER w AS f_mid_max,
       min(p.f_late) OVER w AS f_late_min, max(p.f_late) OVER w AS f_late_max,
       min(p.never_stable) OVER w AS never_stable_min, max(p.never_stable) OVER w AS never_stable_max,
       decision_band(p.t - p.k, p.t) <> 'late' AS late_is_never_stable
FROM per_run p JOIN voters v USING (model, view, k) JOIN chance c USING (model, view, k)
LEFT JOIN fleiss f USING (model, view, k)
WINDOW w AS (PARTITION BY p.model, p.view, p.k)
ORDER BY p.model, p.view, p.k, p.run_id;
