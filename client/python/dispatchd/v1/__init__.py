"""The dispatchd.v1 messages and stubs, generated from proto/dispatchd/v1/*.proto when the
package is built: job_pb2, job_service_pb2(_grpc), worker_service_pb2(_grpc) and
admin_service_pb2(_grpc)."""
