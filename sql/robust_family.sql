-- robust_family(probe_id) -> VARCHAR: the probe family a run belongs to in a robustness set (docs/design.md §5): its
-- probe id without the regularisation strength (the parameters C and C_step), so the linear probe at its chosen C
-- and its neighbour-C runs (linear:C_step=±1) are one family: 'linear:C_step=1,max_epochs=7' -> 'linear:max_epochs=7'.
CREATE OR REPLACE MACRO robust_family(probe_id) AS
    split_part(probe_id, ':', 1) || coalesce(':' || nullif(array_to_string(list_filter(
        string_split(nullif(substr(probe_id, length(split_part(probe_id, ':', 1)) + 2), ''), ','),
        lambda p: NOT regexp_matches(p, '^C(_step)?=')), ','), ''), '');
