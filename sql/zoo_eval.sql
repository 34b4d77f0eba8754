-- zoo_eval(tau := 0.3, top_n := 200) -> (study, ood_set, metric, target, tau, n_models, r2, spearman, kendall):
-- the zoo's correlation table at one τ (DDB) and one top_n (jaccard and the graph distances of CSS).
CREATE OR REPLACE MACRO zoo_eval(tau := 0.3, top_n := 200) AS TABLE
SELECT * FROM zoo_stats([tau], top_n);
