package s3test_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/esf-dev/esf/internal/s3test"
)

// The server stores objects, honours If-None-Match: * with 412, and keeps
// each object as a file at Path.
func TestServer(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	c := srv.Client()
	put := func() error {
		_, err := c.PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String(bucket), Key: aws.String("a/b"), Body: bytes.NewReader([]byte("hello")),
			IfNoneMatch: aws.String("*"),
		})
		return err
	}
	if err := put(); err != nil {
		t.Fatal(err)
	}
	var re *smithyhttp.ResponseError
	if err := put(); !errors.As(err, &re) || re.HTTPStatusCode() != 412 {
		t.Fatalf("second conditional put: err = %v, want a 412", err)
	}
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("a/b")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil || string(b) != "hello" {
		t.Fatalf("get = %q, %v", b, err)
	}
	if b, err := os.ReadFile(srv.Path(bucket, "a/b")); err != nil || string(b) != "hello" {
		t.Fatalf("backing file = %q, %v", b, err)
	}
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("a/b")}); err != nil {
		t.Fatalf("head after restart: %v", err)
	}
}
