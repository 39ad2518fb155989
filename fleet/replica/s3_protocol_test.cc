#include "fleet/replica/s3_protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "fleet/unique_fd.h"

namespace fleetfs::replica::s3 {
namespace {

namespace fs = std::filesystem;

Getenv EnvOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

bool Mentions(const Status& st, std::string_view what) {
  return st.message().find(what) != std::string::npos;
}

// ---- encoding

TEST(UriEncode, keeps_only_unreserved_bytes_and_writes_the_rest_as_upper_case_hex) {
  EXPECT_EQ(UriEncode("AZaz09-._~", false), "AZaz09-._~");
  EXPECT_EQ(UriEncode("a b+c=d&e*f%g", false), "a%20b%2Bc%3Dd%26e%2Af%25g");
  EXPECT_EQ(UriEncode("\xc3\xa9", false), "%C3%A9");  // é, byte by byte
  EXPECT_EQ(UriEncode(std::string_view("\0\xff", 2), false), "%00%FF");
}

TEST(UriEncode, keeps_slashes_in_keys_and_encodes_them_in_query_values) {
  EXPECT_EQ(EncodeKey("fleet/176/acme.db/log/0001.seg"), "fleet/176/acme.db/log/0001.seg");
  EXPECT_EQ(EncodeKey("a b/c:d"), "a%20b/c%3Ad");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
}

TEST(CanonicalQuery, sorts_by_name_and_writes_an_empty_value_as_name_equals) {
  EXPECT_EQ(CanonicalQuery({{"prefix", "fleet/k/"},
                            {"list-type", "2"},
                            {"start-after", "fleet/k/0001"},
                            {"delimiter", "/"},
                            {"max-keys", "1000"}}),
            "delimiter=%2F&list-type=2&max-keys=1000&prefix=fleet%2Fk%2F&start-after=fleet%2Fk%2F0001");
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(CanonicalQuery({{"uploadId", "a+b/c="}, {"partNumber", "10"}}),
            "partNumber=10&uploadId=a%2Bb%2Fc%3D");
  EXPECT_EQ(CanonicalQuery({}), "");
}

TEST(Sha256, matches_the_known_vectors) {
  EXPECT_EQ(Sha256Hex(""), kEmptySha256);
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, of_a_file_range_hashes_those_bytes_only) {
  fs::path p = fs::temp_directory_path() / ("fleetfs-s3-sha-" + std::to_string(::getpid()));
  std::ofstream(p, std::ios::binary) << "xxabcyy";
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  auto h = Sha256HexOfFile(fd.get(), 2, 3);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(*h, Sha256Hex("abc"));
  EXPECT_EQ(Sha256HexOfFile(fd.get(), 5, 10).status().code(), Code::kIoError);  // past the end
  fs::remove(p);
}

// ---- URLs

TEST(ParseS3Url, takes_a_bucket_and_an_optional_prefix) {
  auto a = ParseS3Url("s3://my-bucket");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->bucket, "my-bucket");
  EXPECT_EQ(a->prefix, "");
  auto b = ParseS3Url("s3://my.bucket-1/fleet/prod/");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->bucket, "my.bucket-1");
  EXPECT_EQ(b->prefix, "fleet/prod");
  EXPECT_EQ(ParseS3Url("s3://abc/")->prefix, "");
}

TEST(ParseS3Url, refuses_bad_bucket_names_naming_the_url_and_the_rule) {
  struct Case {
    const char* url;
    const char* rule;
  };
  for (const Case& c : {Case{"s3://ab", "3 to 63"},
                        Case{"s3://", "3 to 63"},
                        Case{"s3://My-Bucket", "lower-case"},
                        Case{"s3://under_score", "lower-case"},
                        Case{"s3://-abc", "begin and end"},
                        Case{"s3://abc.", "begin and end"},
                        Case{"s3://a..b", "two '.'"},
                        Case{"s3://192.168.1.1", "IP address"},
                        Case{"file:///x", "s3://"}}) {
    auto r = ParseS3Url(c.url);
    ASSERT_FALSE(r.ok()) << c.url;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(Mentions(r.status(), c.url)) << r.status().message();
    EXPECT_TRUE(Mentions(r.status(), c.rule)) << r.status().message();
  }
  EXPECT_FALSE(ParseS3Url("s3://" + std::string(64, 'a')).ok());
  EXPECT_TRUE(ParseS3Url("s3://" + std::string(63, 'a')).ok());
}

TEST(ParseS3Url, refuses_prefixes_with_empty_dot_or_dot_dot_parts) {
  for (const char* url : {"s3://bucket//x", "s3://bucket/a//b", "s3://bucket/./x",
                          "s3://bucket/a/..", "s3://bucket/a/.tmp-x"}) {
    auto r = ParseS3Url(url);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << url;
    EXPECT_TRUE(Mentions(r.status(), url)) << r.status().message();
  }
}

TEST(ValidateDestinationUrl, accepts_s3_urls_and_names_the_rule_for_bad_ones) {
  EXPECT_TRUE(ValidateDestinationUrl("s3://bucket/fleet").ok());
  Status st = ValidateDestinationUrl("s3://Bucket/fleet");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Mentions(st, "lower-case")) << st.message();
  st = ValidateDestinationUrl("gs://bucket");
  EXPECT_TRUE(Mentions(st, "s3://")) << st.message();
  EXPECT_TRUE(ValidateDestinationUrl("file:///var/lib/replica").ok());
}

// ---- endpoints

TEST(ResolveS3Endpoint, defaults_to_aws_for_the_region_with_virtual_host_style) {
  auto ep = ResolveS3Endpoint({}, "bucket", EnvOf({{"AWS_REGION", "eu-west-1"}}));
  ASSERT_TRUE(ep.ok()) << ep.status().message();
  EXPECT_EQ(ep->Name(), "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(ep->path_style);
  EXPECT_FALSE(ep->custom);
  EXPECT_EQ(ep->Url("bucket", "/k/x?a=b"), "https://bucket.s3.eu-west-1.amazonaws.com/k/x?a=b");
  EXPECT_EQ(ep->Url("bucket", "?list-type=2"),
            "https://bucket.s3.eu-west-1.amazonaws.com/?list-type=2");
  EXPECT_EQ(ResolveS3Endpoint({}, "bucket", EnvOf({}))->region, "us-east-1");
  EXPECT_EQ(ResolveS3Endpoint({}, "bucket", EnvOf({{"AWS_DEFAULT_REGION", "ap-south-1"}}))->region,
            "ap-south-1");
}

TEST(ResolveS3Endpoint, settings_come_before_the_environment) {
  S3Settings s{.endpoint = "http://127.0.0.1:9000/", .region = "us-west-2", .path_style = {}};
  auto ep = ResolveS3Endpoint(
      s, "bucket",
      EnvOf({{"AWS_REGION", "eu-west-1"}, {"AWS_ENDPOINT_URL", "https://other.example"}}));
  ASSERT_TRUE(ep.ok()) << ep.status().message();
  EXPECT_EQ(ep->Name(), "http://127.0.0.1:9000");
  EXPECT_EQ(ep->region, "us-west-2");
  EXPECT_TRUE(ep->path_style);  // on by default for a custom endpoint
  EXPECT_EQ(ep->Url("bucket", "/k"), "http://127.0.0.1:9000/bucket/k");
  EXPECT_EQ(ep->Url("bucket", "?list-type=2"), "http://127.0.0.1:9000/bucket?list-type=2");
  s.path_style = false;
  EXPECT_FALSE(ResolveS3Endpoint(s, "bucket", EnvOf({}))->path_style);
}

TEST(ResolveS3Endpoint, takes_the_s3_endpoint_variable_before_the_general_one) {
  auto ep = ResolveS3Endpoint({}, "bucket",
                              EnvOf({{"AWS_ENDPOINT_URL", "https://general.example"},
                                     {"AWS_ENDPOINT_URL_S3", "https://s3.example:8443"}}));
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(ep->Name(), "https://s3.example:8443");
  EXPECT_TRUE(ep->custom);
}

TEST(ResolveS3Endpoint, refuses_a_bad_endpoint_or_region_naming_the_setting) {
  auto a = ResolveS3Endpoint({.endpoint = "s3.example.com", .region = "", .path_style = {}}, "bucket", EnvOf({}));
  EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Mentions(a.status(), "replica_endpoint")) << a.status().message();
  auto b = ResolveS3Endpoint({.endpoint = "https://h/path", .region = "", .path_style = {}}, "bucket", EnvOf({}));
  EXPECT_TRUE(Mentions(b.status(), "without a path")) << b.status().message();
  auto c = ResolveS3Endpoint({}, "bucket", EnvOf({{"AWS_REGION", "EU West"}}));
  EXPECT_TRUE(Mentions(c.status(), "AWS_REGION")) << c.status().message();
}

TEST(ResolveS3Endpoint, a_bucket_with_dots_goes_path_style_on_aws) {
  EXPECT_TRUE(ResolveS3Endpoint({}, "my.bucket", EnvOf({}))->path_style);
}

// ---- credentials

constexpr std::string_view kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

TEST(Credentials, come_from_the_environment_first) {
  auto c = LoadS3Credentials(EnvOf({{"AWS_ACCESS_KEY_ID", "AKID"},
                                    {"AWS_SECRET_ACCESS_KEY", std::string(kSecret)},
                                    {"AWS_SESSION_TOKEN", "tok"},
                                    {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"}}));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->access_key, "AKID");
  EXPECT_EQ(c->secret_key, kSecret);
  EXPECT_EQ(c->session_token, "tok");
  EXPECT_EQ(c->source.find(kSecret), std::string::npos);
}

TEST(Credentials, half_of_a_pair_in_the_environment_is_an_error_naming_the_missing_variable) {
  auto c = LoadS3Credentials(EnvOf({{"AWS_SECRET_ACCESS_KEY", std::string(kSecret)}}));
  EXPECT_EQ(c.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Mentions(c.status(), "AWS_ACCESS_KEY_ID")) << c.status().message();
  EXPECT_FALSE(Mentions(c.status(), kSecret));
}

class CredentialsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("fleetfs-s3-creds-" + std::to_string(::getpid()));
    std::ofstream(path_) << "# comment\n"
                            "[default]\n"
                            "aws_access_key_id = DEFAULTID\n"
                            "aws_secret_access_key = " << kSecret << "\n"
                            "\n"
                            "[backup]\r\n"
                            "aws_access_key_id=BACKUPID\r\n"
                            "aws_secret_access_key=" << kSecret << "x\r\n"
                            "aws_session_token = T\r\n"
                            "[broken]\n"
                            "aws_secret_access_key = " << kSecret << "\n";
  }
  void TearDown() override { fs::remove(path_); }
  fs::path path_;
};

TEST_F(CredentialsFile, is_read_at_the_default_profile_when_the_environment_has_none) {
  auto c = LoadS3Credentials(EnvOf({{"AWS_SHARED_CREDENTIALS_FILE", path_.string()}}));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->access_key, "DEFAULTID");
  EXPECT_EQ(c->secret_key, kSecret);
  EXPECT_TRUE(c->session_token.empty());
  EXPECT_NE(c->source.find(path_.string()), std::string::npos);
  EXPECT_NE(c->source.find("default"), std::string::npos);
}

TEST_F(CredentialsFile, aws_profile_chooses_the_section) {
  auto c = LoadS3Credentials(
      EnvOf({{"AWS_SHARED_CREDENTIALS_FILE", path_.string()}, {"AWS_PROFILE", "backup"}}));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->access_key, "BACKUPID");
  EXPECT_EQ(c->secret_key, std::string(kSecret) + "x");
  EXPECT_EQ(c->session_token, "T");
}

TEST_F(CredentialsFile, under_home_is_the_default_place) {
  fs::path home = path_.string() + "-home";
  fs::create_directories(home / ".aws");
  fs::copy_file(path_, home / ".aws" / "credentials");
  auto c = LoadS3Credentials(EnvOf({{"HOME", home.string()}}));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->access_key, "DEFAULTID");
  fs::remove_all(home);
}

TEST_F(CredentialsFile, errors_name_the_file_and_profile_and_never_a_secret) {
  auto missing = LoadS3Credentials(
      EnvOf({{"AWS_SHARED_CREDENTIALS_FILE", path_.string()}, {"AWS_PROFILE", "nope"}}));
  EXPECT_EQ(missing.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Mentions(missing.status(), path_.string())) << missing.status().message();
  EXPECT_TRUE(Mentions(missing.status(), "[nope]")) << missing.status().message();
  auto broken = LoadS3Credentials(
      EnvOf({{"AWS_SHARED_CREDENTIALS_FILE", path_.string()}, {"AWS_PROFILE", "broken"}}));
  EXPECT_EQ(broken.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Mentions(broken.status(), "aws_access_key_id")) << broken.status().message();
  EXPECT_TRUE(Mentions(broken.status(), "[broken]")) << broken.status().message();
  auto absent = LoadS3Credentials(EnvOf({{"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/creds"}}));
  EXPECT_EQ(absent.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Mentions(absent.status(), "/nonexistent/creds")) << absent.status().message();
  for (const auto* st : {&missing.status(), &broken.status(), &absent.status()}) {
    EXPECT_FALSE(Mentions(*st, "wJalrXUtnFEMI")) << st->message();
  }
}

// ---- XML answers

TEST(ParseListPage, reads_keys_prefixes_and_the_continuation_token) {
  auto page = ParseListPage(
      R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>f/k/</Prefix><KeyCount>3</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated><NextContinuationToken>tok/1=</NextContinuationToken>
  <Contents><Key>f/k/0001</Key><Size>3</Size></Contents>
  <Contents><Key>f/k/a&amp;b</Key><Size>3</Size></Contents>
  <CommonPrefixes><Prefix>f/k/sub/</Prefix></CommonPrefixes>
</ListBucketResult>)");
  ASSERT_TRUE(page.ok()) << page.status().message();
  EXPECT_EQ(page->keys, (std::vector<std::string>{"f/k/0001", "f/k/a&b"}));
  EXPECT_EQ(page->prefixes, (std::vector<std::string>{"f/k/sub/"}));
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok/1=");
  auto last = ParseListPage("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->keys.empty());
  EXPECT_FALSE(last->truncated);
}

TEST(ParseListPage, refuses_hostile_answers_with_data_loss) {
  std::string deep;
  for (int i = 0; i < 200000; ++i) deep += "<a>";
  std::string huge = "<ListBucketResult>" + std::string(kMaxXmlBytes, ' ') + "</ListBucketResult>";
  for (const std::string& bad :
       {std::string("not xml"), std::string("<html><body>502</body></html>"),
        std::string("<ListBucketResult><Contents><Key>x</Key>"), deep, huge,
        std::string("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>"),
        std::string("<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>"),
        std::string("")}) {
    auto page = ParseListPage(bad);
    EXPECT_EQ(page.status().code(), Code::kDataLoss) << bad.substr(0, 80);
    EXPECT_LT(page.status().message().size(), 600u);
  }
}

TEST(ParseErrorBody, reads_code_message_region_and_bucket) {
  auto e = ParseErrorBody(R"(<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' is wrong; expecting 'eu-west-1'</Message>
<Region>eu-west-1</Region><BucketName>b</BucketName><RequestId>1</RequestId></Error>)");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "AuthorizationHeaderMalformed");
  EXPECT_EQ(e->region, "eu-west-1");
  EXPECT_EQ(e->bucket, "b");
  EXPECT_NE(e->message.find("expecting"), std::string::npos);
  EXPECT_FALSE(ParseErrorBody("").has_value());
  EXPECT_FALSE(ParseErrorBody("<html/>").has_value());
  EXPECT_FALSE(ParseErrorBody("<Error><Code>").has_value());
  EXPECT_FALSE(ParseErrorBody("<Error><Message>no code</Message></Error>").has_value());
}

TEST(ParseErrorBody, makes_control_characters_printable) {
  auto e = ParseErrorBody("<Error><Code>X\x1b[31m</Code><Message>a\nb</Message></Error>");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "X?[31m");
  EXPECT_EQ(e->message, "a?b");
}

TEST(Multipart, answers_are_read_and_an_error_inside_a_200_is_seen) {
  EXPECT_EQ(*ParseUploadId("<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
                           "<UploadId>VXBsb2FkIElE</UploadId></InitiateMultipartUploadResult>"),
            "VXBsb2FkIElE");
  EXPECT_EQ(ParseUploadId("<InitiateMultipartUploadResult/>").status().code(), Code::kDataLoss);
  EXPECT_EQ(ParseUploadId("<<<").status().code(), Code::kDataLoss);

  auto done = ParseCompleteResult(
      "<CompleteMultipartUploadResult><ETag>\"x-2\"</ETag></CompleteMultipartUploadResult>");
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->has_value());
  auto failed = ParseCompleteResult(
      "<?xml version=\"1.0\"?>\n<Error><Code>InternalError</Code><Message>retry</Message></Error>");
  ASSERT_TRUE(failed.ok());
  ASSERT_TRUE(failed->has_value());
  EXPECT_EQ((*failed)->code, "InternalError");
  EXPECT_EQ(ParseCompleteResult("<Other/>").status().code(), Code::kDataLoss);
  EXPECT_EQ(ParseCompleteResult("").status().code(), Code::kDataLoss);
}

TEST(Multipart, unfinished_uploads_are_listed_with_their_start_times) {
  auto page = ParseUploadsPage(
      "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
      "<NextKeyMarker>f/b</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>"
      "<Upload><Key>f/a</Key><UploadId>u1</UploadId><Initiated>1970-01-02T00:00:01.000Z</Initiated></Upload>"
      "<Upload><Key>f/b</Key><UploadId>u2</UploadId><Initiated>yesterday</Initiated></Upload>"
      "</ListMultipartUploadsResult>");
  ASSERT_TRUE(page.ok()) << page.status().message();
  ASSERT_EQ(page->uploads.size(), 2u);
  EXPECT_EQ(page->uploads[0].key, "f/a");
  EXPECT_EQ(page->uploads[0].upload_id, "u1");
  EXPECT_EQ(page->uploads[0].initiated_s, 86401);
  EXPECT_FALSE(page->uploads[1].initiated_s.has_value());
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_key_marker, "f/b");
  EXPECT_EQ(page->next_upload_id_marker, "u2");
  EXPECT_EQ(ParseUploadsPage("<Error/>").status().code(), Code::kDataLoss);
  EXPECT_EQ(ParseUploadsPage("<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
                             "</ListMultipartUploadsResult>").status().code(),
            Code::kDataLoss);
}

TEST(ParseIsoTime, reads_s3_times_as_unix_seconds_and_refuses_others) {
  EXPECT_EQ(ParseIsoTime("1970-01-01T00:00:00.000Z"), 0);
  EXPECT_EQ(ParseIsoTime("2026-12-02T13:24:37.000Z"), 1796217877);
  EXPECT_EQ(ParseIsoTime("2000-02-29T12:00:00Z"), 951825600);
  for (const char* bad : {"", "2026-12-02", "2026-13-02T00:00:00Z", "2026-12-02 13:24:37",
                          "20x6-12-02T13:24:37Z"}) {
    EXPECT_FALSE(ParseIsoTime(bad).has_value()) << bad;
  }
}

TEST(Multipart, the_complete_body_lists_parts_in_order_with_their_etags) {
  EXPECT_EQ(CompleteMultipartBody({"\"a\"", "\"b\""}),
            "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
            "<Part><PartNumber>1</PartNumber><ETag>\"a\"</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>\"b\"</ETag></Part>"
            "</CompleteMultipartUpload>");
}

}  // namespace
}  // namespace fleetfs::replica::s3
