-- in_scope(scope, split, cross_fit) -> BOOLEAN: which images a summary counts. 'auto' = the test split, or
-- every image of a cross-fit run (all its predictions are out of sample); 'all'; or a split name. Any other
-- scope is an error rather than an empty result (the same list as featstore.schema.SCOPES).
CREATE OR REPLACE MACRO in_scope(scope, image_split, cross_fit) AS
    CASE WHEN scope = 'auto' THEN (cross_fit > 0 AND image_split <> 'skipped') OR image_split = 'test'
         WHEN scope = 'all' THEN image_split <> 'skipped'
         WHEN scope IN ('train', 'val', 'test') THEN image_split = scope
         ELSE error('scope ''' || scope || ''': use auto, all, train, val or test') END;
