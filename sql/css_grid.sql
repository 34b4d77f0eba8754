-- css_grid(id_runs, ood_runs, top_n) -> (id_run, ood_run, distance, value, n_edges): Circuit Shift Scores of each
-- pair (id_runs[i], ood_runs[i]) of circuits of one model, over the signed edge vectors in the fixed edge order:
-- srcc = 1 - Spearman ρ (average ranks for ties), cosine = 1 - cosine similarity, l2 = Euclidean distance,
-- jaccard = 1 - Jaccard overlap of the top_n edges by |score|; plus the graph distances (laplacian, netlsd) of
-- the top_n-edge graphs that `featstore.analytics.circuit_graphs` stored in css_graph for this top_n.
CREATE OR REPLACE MACRO css_grid(id_runs, ood_runs, top_n) AS TABLE
WITH wanted AS (SELECT DISTINCT * FROM (SELECT unnest(id_runs) AS id_run, unnest(ood_runs) AS ood_run)),
pairs AS (
    SELECT w.id_run, w.ood_run, a.edge, a.score AS x, b.score AS y
    FROM wanted w JOIN edges a ON a.run_id = w.id_run JOIN edges b ON b.run_id = w.ood_run AND b.edge = a.edge),
ranked AS (
    SELECT *,
           average_rank(x, (id_run, ood_run)) AS rx, average_rank(y, (id_run, ood_run)) AS ry,
           row_number() OVER (PARTITION BY id_run, ood_run ORDER BY abs(x) DESC, edge) AS top_x,
           row_number() OVER (PARTITION BY id_run, ood_run ORDER BY abs(y) DESC, edge) AS top_y
    FROM pairs),
stats AS (
    SELECT id_run, ood_run, 1 - corr(rx, ry) AS srcc,
           1 - sum(x * y) / (sqrt(sum(x * x)) * sqrt(sum(y * y))) AS cosine,
           sqrt(sum((x - y) * (x - y))) AS l2,
           1 - count(*) FILTER (WHERE top_x <= top_n AND top_y <= top_n)
               / count(*) FILTER (WHERE top_x <= top_n OR top_y <= top_n) AS jaccard,
           count(*) AS n_edges
    FROM ranked GROUP BY id_run, ood_run)
SELECT id_run, ood_run, d.distance,
       CASE d.distance WHEN 'srcc' THEN srcc WHEN 'cosine' THEN cosine WHEN 'l2' THEN l2 ELSE jaccard END AS value,
       n_edges
FROM stats CROSS JOIN (SELECT unnest(['srcc', 'cosine', 'l2', 'jaccard']) AS distance) d
UNION ALL
SELECT g.id_run, g.ood_run, g.distance, g.value, g.n_edges
FROM css_graph g JOIN wanted w ON g.id_run = w.id_run AND g.ood_run = w.ood_run WHERE g.top_n = top_n;
