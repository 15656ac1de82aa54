"""ringml's Spark and MLflow pipelines (installed as ``ringml.pipelines``).

* Spark (the ``[spark]`` extra: pyspark, pandas, pyarrow; Java 17+):
  :mod:`~ringml.pipelines.spark_stream` (change feeds into a Maintainer, exactly once),
  :mod:`~ringml.pipelines.spark_windows` (event-time windows),
  :mod:`~ringml.pipelines.spark_views` (SQL views), :mod:`~ringml.pipelines.spark_distributed`
  (the view tree sharded across executors), :mod:`~ringml.pipelines.spark_checkpoint` and
  :mod:`~ringml.pipelines.spark_session`;
* MLflow (the ``[mlflow]`` extra): :mod:`~ringml.pipelines.mlflow_tracking` (metrics per
  refresh, champion promotion) and :mod:`~ringml.pipelines.mlflow_pyfunc` (the served model);
* the main job behind ``ringml demo`` (both extras): :mod:`~ringml.pipelines.main_job` and
  :mod:`~ringml.pipelines.window_job`.

Importing this package imports none of them: import the module you need.
"""
