-- zoo_tau_sweep(taus := [0.1, 0.2, 0.3, 0.4, 0.5]) -> (study, ood_set, metric, target, tau, n_models, r2,
-- spearman, kendall): the DDB rows of the zoo's correlation table for each τ of the sweep.
CREATE OR REPLACE MACRO zoo_tau_sweep(taus := [0.1, 0.2, 0.3, 0.4, 0.5]) AS TABLE
SELECT * FROM zoo_stats(taus, 200) WHERE metric LIKE 'ddb_%';
