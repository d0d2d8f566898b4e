this is not a SavedModel
this is not a SavedModel
this is not a SavedModel
this is not a SavedModel
