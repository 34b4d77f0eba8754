-- css(id_run, ood_run, distance := 'srcc', top_n := 200) -> (id_run, ood_run, distance, css, n_edges): one
-- distance (srcc | cosine | l2 | jaccard, or a stored laplacian | netlsd) of `css_grid` for one pair of circuits.
CREATE OR REPLACE MACRO css(id_run, ood_run, distance := 'srcc', top_n := 200) AS TABLE
SELECT g.id_run, g.ood_run, g.distance, g.value AS css, g.n_edges
FROM css_grid([id_run], [ood_run], top_n) g WHERE g.distance = distance;
