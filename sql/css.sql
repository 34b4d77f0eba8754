-- css(id_run, ood_run, distance := 'srcc', top_n := 200) -> (id_run, ood_run, distance, css, n_edges): Circuit
-- Shift Score between two circuits of one model over the signed edge vector in the fixed edge order:
-- srcc = 1 - Spearman ρ (average ranks for ties), cosine = 1 - cosine similarity, l2 = Euclidean distance,
-- jaccard = 1 - Jaccard overlap of the top_n edges by |score|.
CREATE OR REPLACE MACRO css(id_run, ood_run, distance := 'srcc', top_n := 200) AS TABLE
WITH pairs AS (
    SELECT a.edge, a.score AS x, b.score AS y FROM edges a JOIN edges b USING (edge)
    WHERE a.run_id = id_run AND b.run_id = ood_run),
ranked AS (
    SELECT *, (rank() OVER (ORDER BY x) + count(*) OVER () + 1 - rank() OVER (ORDER BY x DESC)) / 2.0 AS rx,
              (rank() OVER (ORDER BY y) + count(*) OVER () + 1 - rank() OVER (ORDER BY y DESC)) / 2.0 AS ry,
              row_number() OVER (ORDER BY abs(x) DESC, edge) AS top_x,
              row_number() OVER (ORDER BY abs(y) DESC, edge) AS top_y
    FROM pairs),
stats AS (
    SELECT 1 - corr(rx, ry) AS srcc, 1 - sum(x * y) / (sqrt(sum(x * x)) * sqrt(sum(y * y))) AS cosine,
           sqrt(sum((x - y) * (x - y))) AS l2,
           1 - count(*) FILTER (WHERE top_x <= top_n AND top_y <= top_n)
               / count(*) FILTER (WHERE top_x <= top_n OR top_y <= top_n) AS jaccard,
           count(*) AS n_edges
    FROM ranked)
SELECT id_run AS id_run, ood_run AS ood_run, distance AS distance,
       CASE distance WHEN 'srcc' THEN srcc WHEN 'cosine' THEN cosine WHEN 'l2' THEN l2 WHEN 'jaccard' THEN jaccard END
           AS css, n_edges
FROM stats;
