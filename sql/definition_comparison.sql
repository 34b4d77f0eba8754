-- definition_comparison(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto') -> one row (summary, ranking,
-- crosstab, disagreements, decided): every table `featstore compare` shows, each a list of its rows in its order,
-- from one computation of decision_definitions and one join of its pairs; the macros definition_summary,
-- definition_ranking (definition_agreement, definition_pair_stats), definition_crosstab, definition_disagreements
-- and definition_decided_disagreements are its columns unnested (their comments say what each holds).
CREATE OR REPLACE MACRO definition_comparison(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto') AS TABLE
WITH d AS MATERIALIZED (SELECT * FROM decision_definitions(runs, k, min_conf, scope)),
names AS MATERIALIZED (  -- each definition's number in name order: the pairs join and group on it
    SELECT definition, row_number() OVER (ORDER BY definition) AS di FROM (SELECT DISTINCT definition FROM d)),
numbered AS MATERIALIZED (
    SELECT n.di, d.image_id, d.layer, d.t, d.band, d.kind, definition_decided(d.kind, d.layer, d.t, k) AS decided
    FROM d JOIN names n USING (definition)),
p AS NOT MATERIALIZED (  -- definition_pairs: every image two definitions both place, per pair a < b
    SELECT x.di AS ai, y.di AS bi, x.image_id, x.layer AS layer_a, y.layer AS layer_b, x.t AS t_a,
           x.band AS band_a, y.band AS band_b, x.kind AS kind_a, y.kind AS kind_b, x.decided AND y.decided AS decided,
           CASE WHEN x.band = 'early' AND y.band = 'late' THEN 'a early, b late'
                WHEN x.band = 'late' AND y.band = 'early' THEN 'a late, b early' END AS side
    FROM numbered x JOIN numbered y ON x.image_id = y.image_id AND x.di < y.di),
summary AS (
    SELECT definition, kind, run_id, count(*) AS n, avg(layer) AS mean, median(layer) AS median,
           avg((band = 'early')::INT) AS f_early, avg((band = 'mid')::INT) AS f_mid,
           avg((band = 'late')::INT) AS f_late,
           CASE WHEN kind = 'depth' THEN avg((band = 'unsettled')::INT) END AS f_unsettled,
           bool_and(kind <> 'depth' AND decision_band(t - k, t) <> 'late') AS late_is_never_stable
    FROM d GROUP BY definition, kind, run_id),
cells AS (  -- per pair, its images counted by their two layers (each layer has one band and one decided flag)
    SELECT ai, bi, layer_a, layer_b, band_a, band_b, kind_a, kind_b, decided, count(*) AS n
    FROM p GROUP BY ALL),
pairs AS (SELECT ai, bi, any_value(kind_a) AS kind_a, any_value(kind_b) AS kind_b, sum(n)::BIGINT AS total
          FROM cells GROUP BY ai, bi),
ranks_a AS (  -- a layer's average rank among its pair's images (average_rank: ties share the ranks they span)
    SELECT ai, bi, layer_a, sum(sum(n)) OVER (PARTITION BY ai, bi ORDER BY layer_a) - (sum(n) - 1) / 2 AS ra
    FROM cells GROUP BY ai, bi, layer_a),
ranks_b AS (
    SELECT ai, bi, layer_b, sum(sum(n)) OVER (PARTITION BY ai, bi ORDER BY layer_b) - (sum(n) - 1) / 2 AS rb
    FROM cells GROUP BY ai, bi, layer_b),
centred AS (  -- each cell's ranks less their mean, (n + 1) / 2
    SELECT c.*, ra - (pr.total + 1) / 2 AS da, rb - (pr.total + 1) / 2 AS db
    FROM cells c JOIN pairs pr USING (ai, bi) JOIN ranks_a USING (ai, bi, layer_a)
    JOIN ranks_b USING (ai, bi, layer_b)),
stats AS (  -- Spearman's ρ: Pearson's of the ranks, summed in a fixed order (NULL when one side is constant)
    SELECT ai, bi, sum(n)::BIGINT AS n,
           CASE WHEN count(DISTINCT layer_a) > 1 AND count(DISTINCT layer_b) > 1
                THEN sum(n * da * db ORDER BY layer_a, layer_b)
                     / sqrt(sum(n * da * da ORDER BY layer_a, layer_b) * sum(n * db * db ORDER BY layer_a, layer_b))
           END AS spearman,
           coalesce(sum(n) FILTER (WHERE band_a = band_b), 0)::DOUBLE / sum(n)::DOUBLE AS same_band,
           coalesce(sum(n) FILTER (WHERE band_a = 'early' AND band_b = 'late'), 0)::BIGINT AS early_a_late_b,
           coalesce(sum(n) FILTER (WHERE band_a = 'late' AND band_b = 'early'), 0)::BIGINT AS late_a_early_b,
           coalesce(sum(n) FILTER (WHERE decided AND band_a <> band_b AND 'mid' NOT IN (band_a, band_b)),
                    0)::BIGINT AS early_late_decided
    FROM centred GROUP BY ai, bi),
bands AS (SELECT unnest(['early', 'mid', 'late', 'unsettled']) AS band, unnest([0, 1, 2, 3]) AS position),
crosstab AS (
    SELECT pr.ai, pr.bi, x.band AS band_a, y.band AS band_b, coalesce(c.n, 0) AS n,
           coalesce(c.n, 0) / pr.total AS share, x.position AS position_a, y.position AS position_b
    FROM pairs pr CROSS JOIN bands x CROSS JOIN bands y
    LEFT JOIN (SELECT ai, bi, band_a, band_b, sum(n)::BIGINT AS n FROM cells GROUP BY ALL) c
           ON c.ai = pr.ai AND c.bi = pr.bi AND c.band_a = x.band AND c.band_b = y.band
    WHERE (x.band <> 'unsettled' OR pr.kind_a = 'depth') AND (y.band <> 'unsettled' OR pr.kind_b = 'depth')),
opposite AS MATERIALIZED (  -- the images early by one definition and late by the other, picked by a fixed hash
    SELECT ai, bi, image_id, layer_a, layer_b, t_a, side, decided,
           row_number() OVER (PARTITION BY ai, bi, side ORDER BY hash(image_id), image_id) AS pick,
           count(*) FILTER (WHERE decided) OVER (PARTITION BY ai, bi) AS n_decided,
           row_number() OVER (PARTITION BY ai, bi, side, decided ORDER BY hash(image_id), image_id) AS pick_decided
    FROM p WHERE side IS NOT NULL),
named AS (  -- a pair's numbers as names
    SELECT a.di AS ai, b.di AS bi, a.definition AS a, b.definition AS b FROM names a JOIN names b ON a.di < b.di)
SELECT
    (SELECT list(s ORDER BY list_position(runs, s.run_id), CASE s.kind WHEN 'l*' THEN 0 WHEN 'joint' THEN 1 ELSE 2 END)
     FROM summary s) AS summary,
    (SELECT list({'a': n.a, 'b': n.b, 'n': s.n, 'spearman': s.spearman, 'same_band': s.same_band,
                  'early_a_late_b': s.early_a_late_b, 'late_a_early_b': s.late_a_early_b,
                  'early_late_decided': s.early_late_decided}
                 ORDER BY s.early_late_decided DESC, s.same_band, n.a, n.b)
     FROM stats s JOIN named n USING (ai, bi)) AS ranking,
    (SELECT list({'a': n.a, 'b': n.b, 'band_a': c.band_a, 'band_b': c.band_b, 'n': c.n, 'share': c.share}
                 ORDER BY n.a, n.b, c.position_a, c.position_b)
     FROM crosstab c JOIN named n USING (ai, bi)) AS crosstab,
    (SELECT list({'a': n.a, 'b': n.b, 'side': o.side, 'image_id': o.image_id, 'path': i.path, 'label': i.label,
                  'layer_a': o.layer_a, 'layer_b': o.layer_b, 't': o.t_a}
                 ORDER BY n.a, n.b, o.side, o.image_id)
     FROM opposite o JOIN named n USING (ai, bi) JOIN images i USING (image_id) WHERE o.pick <= per_pair)
    AS disagreements,
    (SELECT list({'a': n.a, 'b': n.b, 'n': o.n_decided, 'side': o.side, 'image_id': o.image_id, 'path': i.path,
                  'label': i.label, 'layer_a': o.layer_a, 'layer_b': o.layer_b, 't': o.t_a}
                 ORDER BY o.n_decided DESC, n.a, n.b, o.side, o.image_id)
     FROM opposite o JOIN named n USING (ai, bi) JOIN images i USING (image_id)
     WHERE o.decided AND o.pick_decided <= per_pair) AS decided;
