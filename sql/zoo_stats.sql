-- zoo_stats(taus, top_n) -> (study, ood_set, metric, target, tau, n_models, r2, spearman, kendall): how well each
-- zoo metric predicts its target across the models: R² of the least-squares line, Spearman's ρ (average ranks
-- for ties) and Kendall's τ-b, per study, OOD set, metric and τ.
CREATE OR REPLACE MACRO zoo_stats(taus, top_n) AS TABLE
WITH p AS (SELECT * FROM zoo_points(taus, top_n) WHERE isfinite(x) AND isfinite(y)),
ranked AS (
    SELECT *, average_rank(x, (study, ood_set, metric, tau)) AS rx, average_rank(y, (study, ood_set, metric, tau)) AS ry
    FROM p),
concordance AS (
    SELECT a.study, a.ood_set, a.metric, a.tau,
           sum(sign(a.x - b.x) * sign(a.y - b.y)) / sqrt(sum(abs(sign(a.x - b.x))) * sum(abs(sign(a.y - b.y))))
               AS kendall
    FROM p a JOIN p b ON a.study = b.study AND a.ood_set = b.ood_set AND a.metric = b.metric AND a.tau = b.tau
                     AND a.model < b.model
    GROUP BY a.study, a.ood_set, a.metric, a.tau)
SELECT r.study, r.ood_set, r.metric, any_value(r.target) AS target, r.tau, count(*) AS n_models,
       regr_r2(r.y, r.x) AS r2, corr(r.rx, r.ry) AS spearman, any_value(c.kendall) AS kendall
FROM ranked r LEFT JOIN concordance c USING (study, ood_set, metric, tau)
GROUP BY r.study, r.ood_set, r.metric, r.tau ORDER BY r.study, r.ood_set, r.metric, r.tau;
