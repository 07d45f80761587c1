from textkit import camel_case, pascal_case, snake_case, split_words


def test_split_words_handles_acronyms_and_separators():
    assert split_words("HTTPServerError") == ["http", "server", "error"]
    assert split_words("user-id / name") == ["user", "id", "name"]


def test_snake_case():
    assert snake_case("getHTTPResponse") == "get_http_response"
    assert snake_case("Already snake_case") == "already_snake_case"


def test_camel_and_pascal_case():
    assert camel_case("user account id") == "userAccountId"
    assert pascal_case("user_account_id") == "UserAccountId"
    assert camel_case("") == ""
