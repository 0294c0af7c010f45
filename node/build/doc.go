package nodebuild
